//! Each test acts in its own moto account through the emulator header, so
//! tests sharing one moto server never see each other's resources.

use snm_testkit as support;

use support::World;

#[tokio::test]
async fn each_world_has_its_own_moto_account() {
    let a = World::new("aws-a").await;
    let b = World::new("aws-b").await;
    assert_ne!(a.account, b.account);
    a.aws
        .ec2
        .create_key_pair()
        .key_name("only-in-a")
        .send()
        .await
        .expect("create key pair in account a");
    let names = |w: &World| {
        let ec2 = w.aws.ec2.clone();
        async move {
            ec2.describe_key_pairs()
                .send()
                .await
                .expect("describe key pairs")
                .key_pairs()
                .iter()
                .filter_map(|k| k.key_name().map(str::to_string))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(names(&a).await, vec!["only-in-a".to_string()]);
    assert!(
        names(&b).await.is_empty(),
        "account b must not see account a's key pair"
    );
    let groups = b
        .aws
        .autoscaling
        .describe_auto_scaling_groups()
        .send()
        .await
        .expect("autoscaling answers through the same endpoint");
    assert!(groups.auto_scaling_groups().is_empty());
}
