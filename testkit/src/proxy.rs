//! A TCP proxy in front of the apiserver that a test can cut: the manager
//! behind it loses the apiserver (its lease renewals fail) while the test's
//! own client, direct, still reads everything.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct CuttableProxy {
    pub port: u16,
    cut: CancellationToken,
}

impl CuttableProxy {
    /// Forwards every connection on a free loopback port to `target`.
    pub async fn start(target: SocketAddr) -> CuttableProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = CancellationToken::new();
        let token = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if token.is_cancelled() {
                    continue; // dropped: the connection is refused as it opens
                }
                let token = token.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = token.cancelled() => {}
                    }
                });
            }
        });
        CuttableProxy { port, cut }
    }

    /// From now on nothing passes: open connections are closed, new ones dropped.
    pub fn cut(&self) {
        self.cut.cancel();
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.cut.cancel();
    }
}

/// A copy of `kubeconfig` whose clusters are reached through `port` on
/// loopback instead (JSON, which kubeconfig readers take as YAML).
pub fn kubeconfig_through(kubeconfig: &std::path::Path, port: u16) -> tempfile::NamedTempFile {
    let mut config = kube::config::Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    for cluster in &mut config.clusters {
        if let Some(c) = cluster.cluster.as_mut()
            && let Some(server) = c.server.as_mut()
        {
            let (scheme, rest) = server.split_once("://").expect("server URL");
            let path = rest.split_once('/').map(|(_, p)| p).unwrap_or("");
            *server = format!("{scheme}://127.0.0.1:{port}/{path}");
        }
    }
    let file = tempfile::NamedTempFile::new().expect("kubeconfig file");
    std::fs::write(
        file.path(),
        serde_json::to_vec(&config).expect("serialize kubeconfig"),
    )
    .expect("write kubeconfig");
    file
}

/// The apiserver's address in `kubeconfig` (its first cluster).
pub fn apiserver_address(kubeconfig: &std::path::Path) -> SocketAddr {
    let config = kube::config::Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let server = config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .expect("a cluster server");
    let host = server
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
        .expect("server URL");
    std::net::ToSocketAddrs::to_socket_addrs(&host)
        .ok()
        .and_then(|mut a| a.next())
        .expect("apiserver address")
}
