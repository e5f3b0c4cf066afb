//! Stamps the binary with the git commit it was built from
//! (`spot-node-manager --version`): `SNM_GIT_COMMIT` when the builder sets it
//! (an image built from a tarball), else `git rev-parse`, else "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    pack_relative_relocations();
    println!("cargo:rerun-if-env-changed=SNM_GIT_COMMIT");
    let commit = std::env::var("SNM_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SNM_GIT_COMMIT={commit}");
    // Stamp again when HEAD moves: HEAD itself (a checkout), the branches
    // (a commit writes its branch's file; cargo scans a directory's files),
    // and packed refs.
    if let (Some(git_dir), Some(common)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) {
        // Only paths that exist: cargo counts a missing one as changed, and
        // rebuilt everything at every invocation in a clone with no
        // packed-refs file.
        let watched = [
            format!("{git_dir}/HEAD"),
            format!("{common}/refs/heads"),
            format!("{common}/packed-refs"),
        ];
        for path in watched.iter().filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// Links the binaries with packed relative relocations (DT_RELR): a
/// position-independent executable otherwise carries one 24-byte entry per
/// pointer to patch at load (2.4 MB here), which the loader reads whole at
/// start, so it stays resident; packed, 33 KB (`benches/footprint.rs`: 2.7
/// MiB less resident). GNU ld 2.38+ and glibc 2.36+ know it; ld leaves it
/// out when the glibc linked against does not, and an older ld only warns.
fn pack_relative_relocations() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
