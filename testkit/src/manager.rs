//! A manager process started from the binary cargo built for the tests, its
//! admin endpoints, and reading its metrics.

use crate::plane::{control_plane, free_port, unique};
use crate::world::World;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The manager binary cargo built for the running test or bench:
/// `SNM_MANAGER_BIN`, else `spot-node-manager` in the profile directory the
/// test binary runs from (`target/<profile>/deps/..`).
pub fn manager_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SNM_MANAGER_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("spot-node-manager"))
        .expect("the test binary runs from target/<profile>/deps");
    assert!(
        path.exists(),
        "no manager binary at {} (cargo builds it for integration tests and benches; or set SNM_MANAGER_BIN)",
        path.display()
    );
    path
}

/// A plain HTTP GET on loopback: (status code, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// A manager process, killed when dropped.
pub struct ManagerProcess {
    pub child: Child,
    pub admin_port: u16,
    pub log: PathBuf,
}

impl ManagerProcess {
    /// Starts `spot-node-manager run` against the test control plane.
    pub fn start(world: &World, extra_args: &[&str]) -> ManagerProcess {
        Self::start_env(world, extra_args, &[])
    }

    /// The same, with extra environment variables (e.g. `SNM_CRASH_AT`).
    pub fn start_env(world: &World, extra_args: &[&str], env: &[(&str, &str)]) -> ManagerProcess {
        Self::start_through(world, world.kubeconfig(), extra_args, env)
    }

    /// The same, reaching the apiserver with `kubeconfig` (e.g. through a
    /// [`crate::proxy::CuttableProxy`]).
    pub fn start_through(
        world: &World,
        kubeconfig: &std::path::Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> ManagerProcess {
        Self::start_binary(&manager_binary(), world, kubeconfig, extra_args, env)
    }

    /// The same, running `binary` (e.g. an earlier release, for the upgrade test).
    pub fn start_binary(
        binary: &std::path::Path,
        world: &World,
        kubeconfig: &std::path::Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> ManagerProcess {
        let admin_port = free_port();
        let log = std::env::temp_dir().join(format!("{}.log", unique("snm-manager")));
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(binary)
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", &world.namespace])
            .args(["--admin-address", &format!("127.0.0.1:{admin_port}")])
            .args(["--aws-region", "ap-northeast-1"])
            .args(["--aws-endpoint", &control_plane().moto_endpoint])
            .args(["--aws-emulator-account", &world.account])
            .args(extra_args)
            .env(
                "SNM_CONTROL_PLANE_NODE_SELECTOR",
                world.master_node_selector(),
            )
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("RUST_LOG", "spot_node_manager=debug,info")
            .envs(env.iter().copied())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start manager");
        ManagerProcess {
            child,
            admin_port,
            log,
        }
    }

    /// True while the process has not exited.
    pub fn child_alive(&self) -> bool {
        std::process::Command::new("kill")
            .args(["-0", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success())
            && !std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
                .unwrap_or_default()
                .contains(") Z ")
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log as plain text (the manager colours its fields).
    pub fn plain_logs(&self) -> String {
        without_colours(&self.logs())
    }

    /// What a failed assertion prints: the last `n` lines above DEBUG
    /// first (CI shows a failure's first lines only), then the whole log.
    pub fn logs_for_failure(&self, n: usize) -> String {
        let logs = self.plain_logs();
        let said: Vec<&str> = logs.lines().filter(|l| !l.contains(" DEBUG ")).collect();
        format!(
            "the manager's last {n} lines above DEBUG:\n{}\n\nits whole log:\n{logs}",
            said[said.len().saturating_sub(n)..].join("\n")
        )
    }

    /// Reconciles of `group` (a NodeGroup's name) by `controller` that have
    /// ended so far, from the manager's log (each ends with one line in its
    /// span).
    pub fn reconciles_of(&self, controller: &str, group: &str) -> usize {
        self.ended_reconciles(controller, group, None)
    }

    /// Reconciles of the child resource `name` (a Refresher or Replenisher)
    /// of `group` by `controller` that have ended so far.
    pub fn reconciles_of_child(&self, controller: &str, group: &str, name: &str) -> usize {
        self.ended_reconciles(controller, group, Some(name))
    }

    fn ended_reconciles(&self, controller: &str, group: &str, name: Option<&str>) -> usize {
        let span = format!("reconcile{{controller=\"{controller}\" group=\"{group}\"}}");
        let object = name.map(|n| format!("object=\"{n}\""));
        self.logs()
            .lines()
            .filter(|l| l.contains(&span) && l.contains("reconcile ended"))
            .filter(|l| object.as_ref().is_none_or(|o| l.contains(o.as_str())))
            .count()
    }

    /// Waits `long`, and fails unless `controller` reconciled each of
    /// `groups` at least twice meanwhile: a test that asserts nothing
    /// happened must also show that the manager looked and did nothing.
    pub async fn idle_while_reconciling(&self, controller: &str, groups: &[&str], long: Duration) {
        let before: Vec<usize> = groups
            .iter()
            .map(|g| self.reconciles_of(controller, g))
            .collect();
        tokio::time::sleep(long).await;
        for (group, before) in groups.iter().zip(before) {
            let ran = self.reconciles_of(controller, group) - before;
            assert!(
                ran >= 2,
                "{controller} reconciled {group} {ran} time(s) in {long:?}, expected at least 2"
            );
        }
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "manager did not exit on SIGTERM:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub async fn metrics(&self) -> Option<String> {
        match http_get(self.admin_port, "/metrics").await {
            Some((200, body)) => Some(body),
            _ => None,
        }
    }

    /// The metrics text, failing the test when the endpoint does not answer
    /// or serves none of the manager's metrics: a check that some series is
    /// absent must not pass on an empty body.
    pub async fn assert_metrics(&self) -> String {
        let body = self.metrics().await.unwrap_or_else(|| {
            panic!(
                "the metrics endpoint on port {} did not answer:\n{}",
                self.admin_port,
                self.logs()
            )
        });
        assert!(
            body.contains("spot_node_manager_"),
            "no manager metrics served:\n{body}"
        );
        body
    }

    /// Asserts each of `series` (name with labels, as exposed) has its
    /// value in the metrics served now.
    pub async fn assert_metric_values(&self, series: &[(&str, f64)]) {
        let body = self.assert_metrics().await;
        for (name, value) in series {
            assert_eq!(metric(&body, name), Some(*value), "{name} in:\n{body}");
        }
    }

    /// The value of the `spot_node_manager_leader` gauge.
    pub async fn is_leader(&self) -> Option<bool> {
        let metrics = self.metrics().await?;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("spot_node_manager_leader "))
            .map(|v| v.trim() == "1")
    }
}

impl Drop for ManagerProcess {
    /// Kills the process. Its log is removed unless the test is failing
    /// (dropped while panicking) or `SNM_KEEP_LOGS` is set: passing tests
    /// left thousands of logs in the temp directory.
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() && std::env::var_os("SNM_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// The apiserver's own metrics, as exposed at `/metrics`.
pub async fn apiserver_metrics(client: &kube::Client) -> kube::Result<String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a GET request");
    client.request_text(request).await
}

/// A label's value on one exposed series line (`verb` in
/// `apiserver_request_total{verb="GET",...} 3`).
pub fn series_label<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    // Whole label names only: `resource` is not the end of `subresource`.
    let at = [format!("{{{key}=\""), format!(",{key}=\"")]
        .iter()
        .find_map(|k| line.find(k.as_str()).map(|i| i + k.len()))?;
    let len = line[at..].find('"')?;
    Some(&line[at..at + len])
}

/// The value at the end of one exposed series line (0 if unreadable).
pub fn series_value(line: &str) -> f64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The value of one series (name with its labels, as exposed) in a metrics text.
pub fn metric(metrics: &str, series: &str) -> Option<f64> {
    let prefix = format!("{series} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// `spot_node_manager_reconciles_total` of one controller in a metrics text.
pub fn reconciles(metrics: &str, controller: &str) -> u64 {
    metric(
        metrics,
        &format!("spot_node_manager_reconciles_total{{controller=\"{controller}\"}}"),
    )
    .unwrap_or(0.0) as u64
}

/// How many AWS mutations of `action` the manager performed.
pub fn performed(metrics: &str, action: &str) -> u64 {
    performed_on(metrics, "aws", action)
}

/// How many Kubernetes mutations of `action` (a cordon, an eviction, a
/// Node patch) the manager performed.
pub fn performed_in_kubernetes(metrics: &str, action: &str) -> u64 {
    performed_on(metrics, "kubernetes", action)
}

fn performed_on(metrics: &str, target: &str, action: &str) -> u64 {
    metric(
        metrics,
        &format!(
            "spot_node_manager_mutations_total{{target=\"{target}\",action=\"{action}\",outcome=\"performed\"}}"
        ),
    )
    .unwrap_or(0.0) as u64
}

/// Managers started for a world, from its config.
impl World {
    /// Starts a manager for this world with leader election off and a fast resync.
    pub fn start_manager(&self, extra: &[&str]) -> (ManagerProcess, tempfile::NamedTempFile) {
        self.start_manager_with("resyncInterval: 2s\n", extra, &[])
    }

    /// Starts a manager with this config file, extra flags and environment.
    pub fn start_manager_with(
        &self,
        config_yaml: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (ManagerProcess, tempfile::NamedTempFile) {
        self.start_manager_binary(&manager_binary(), config_yaml, extra, env)
    }

    /// Runs a manager (fault-injection build) until it aborts at crash point
    /// `point`, as `kill -9` would, asserting it got there; then returns.
    pub async fn assert_crashes_at(&self, point: &str) {
        let (mut manager, _config) =
            self.start_manager_with("resyncInterval: 2s\n", &[], &[("SNM_CRASH_AT", point)]);
        crate::assert_eventually(
            &format!("a crash at {point}"),
            std::time::Duration::from_secs(180),
            || async { (!manager.child_alive()).then_some(()) },
        )
        .await;
        assert!(
            manager.logs().contains(&format!("crash point {point}")),
            "exited without reaching {point}:\n{}",
            manager.logs()
        );
        manager.kill();
    }

    /// What `spot-node-manager preview` says of group `name` (None while it
    /// names no such group).
    pub async fn preview_of(&self, name: &str) -> Option<serde_json::Value> {
        group_in(&self.preview(&[]).await, name)
    }

    /// Runs `spot-node-manager preview -o json` (and `extra` flags) for this
    /// world, as a user would with the manager's own kubeconfig and AWS
    /// access; its answer.
    pub async fn preview(&self, extra: &[&str]) -> serde_json::Value {
        let output = self.preview_output(extra).await;
        assert!(
            output.status.success(),
            "preview failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "preview's JSON: {e}: {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }

    /// The preview's process output, whether it succeeded or not.
    pub async fn preview_output(&self, extra: &[&str]) -> std::process::Output {
        self.read_only_output("preview", &[&["-o", "json"], extra].concat())
            .await
    }

    /// Runs `spot-node-manager check -o json` (and `extra` flags) for this
    /// world, as a user would with the manager's own kubeconfig and AWS
    /// access: its findings, and whether it exited 0.
    pub async fn check(&self, extra: &[&str]) -> (bool, serde_json::Value) {
        let output = self
            .read_only_output("check", &[&["-o", "json"], extra].concat())
            .await;
        let answer = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "check's JSON: {e}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (output.status.success(), answer)
    }

    /// A read-only subcommand (`preview`, `check`) run against this world,
    /// with `extra` flags (its output format among them).
    pub async fn read_only_output(&self, subcommand: &str, extra: &[&str]) -> std::process::Output {
        let mut command = Command::new(manager_binary());
        command
            .arg(subcommand)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--namespace", &self.namespace])
            .args(["--aws-region", "ap-northeast-1"])
            .args(["--aws-endpoint", &control_plane().moto_endpoint])
            .args(["--aws-emulator-account", &self.account])
            .args(extra)
            .env(
                "SNM_CONTROL_PLANE_NODE_SELECTOR",
                self.master_node_selector(),
            )
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env_remove("RUST_LOG");
        // Off the test's runtime: the simulated kubelet runs on it.
        tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("the subcommand's thread")
            .expect("run the subcommand")
    }

    /// The same, running `binary` instead of this tree's manager.
    pub fn start_manager_binary(
        &self,
        binary: &std::path::Path,
        config_yaml: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (ManagerProcess, tempfile::NamedTempFile) {
        let config = tempfile::NamedTempFile::new().expect("config");
        std::fs::write(config.path(), config_yaml).expect("write config");
        let path = config.path().to_str().expect("utf-8").to_string();
        let mut args = vec!["--config", path.as_str(), "--leader-election", "false"];
        args.extend_from_slice(extra);
        let process = ManagerProcess::start_binary(binary, self, self.kubeconfig(), &args, env);
        (process, config)
    }
}

/// Group `name`'s entry in a preview's answer (a list of groups).
pub fn group_in(answer: &serde_json::Value, name: &str) -> Option<serde_json::Value> {
    answer
        .as_array()?
        .iter()
        .find(|g| g["group"] == name)
        .cloned()
}

/// `log` without its ANSI colour sequences (ESC … m).
pub fn without_colours(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod series_tests {
    use super::*;

    #[test]
    fn a_label_is_read_by_its_whole_name() {
        let line = r#"apiserver_request_duration_seconds_count{resource="nodes",scope="resource",subresource="status",verb="PATCH"} 12"#;
        assert_eq!(series_label(line, "resource"), Some("nodes"));
        assert_eq!(series_label(line, "subresource"), Some("status"));
        assert_eq!(series_label(line, "verb"), Some("PATCH"));
        assert_eq!(series_label(line, "source"), None);
        assert_eq!(series_value(line), 12.0);
    }

    #[test]
    fn colours_are_taken_out_of_a_log_line() {
        let coloured = "\u{1b}[2maction\u{1b}[0m=\"cordon\" object=node/n1";
        assert_eq!(
            without_colours(coloured),
            "action=\"cordon\" object=node/n1"
        );
    }
}
