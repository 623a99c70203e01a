//! The example binaries as a user runs them: found next to the test binary (`cargo test` builds
//! the examples first), started on a free port, read for their one `listening on` line, stopped by
//! a signal. Shared by the test binaries that run examples.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// The example binary `name`, next to this test's binary (`cargo test` builds examples first).
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test` (which builds the examples) or `cargo build --examples`",
        path.display()
    );
    path
}

pub struct Running {
    pub child: Child,
    pub base: String,
    pub stdout: BufReader<tokio::process::ChildStdout>,
    /// Kept by [`start_keeping_stderr`], read by [`Running::stop_with`].
    pub stderr: Option<tokio::process::ChildStderr>,
}

/// Starts an example and waits for its `listening on http://ADDR` line.
pub async fn start(name: &str, args: &[&str]) -> Running {
    launch(name, args, false).await
}

/// [`start`], keeping the example's stderr for [`Running::stop_with`] to return (for examples
/// that write little there: warnings).
pub async fn start_keeping_stderr(name: &str, args: &[&str]) -> Running {
    launch(name, args, true).await
}

async fn launch(name: &str, args: &[&str], keep_stderr: bool) -> Running {
    let mut child = Command::new(example(name))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(if keep_stderr {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stderr = child.stderr.take();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(60), stdout.read_line(&mut line))
        .await
        .expect("the example did not start")
        .unwrap();
    let base = line
        .trim_end()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(
        base.starts_with("http://127.0.0.1:") && !base.ends_with(":0"),
        "{base}"
    );
    Running {
        child,
        base,
        stdout,
        stderr,
    }
}

impl Running {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends `signal` and checks the exit code 0 and that stdout held nothing more; returns
    /// stderr when it was kept (else "").
    pub async fn stop_with(mut self, signal: &str) -> String {
        let pid = self.child.id().unwrap().to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
        let code = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("no exit after the signal")
            .unwrap();
        assert_eq!(code.code(), Some(0), "exit code after {signal}");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "", "exactly one line on stdout");
        let mut err = String::new();
        if let Some(stderr) = &mut self.stderr {
            stderr.read_to_string(&mut err).await.unwrap();
        }
        err
    }
}
