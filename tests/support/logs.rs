//! What a test logs through `tracing`, captured as text.

use std::sync::{Arc, Mutex};

/// Everything a `tracing` subscriber wrote, as text: the writer of [`log_into`].
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[allow(dead_code)] // Each test binary uses some of them.
impl Logs {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
    /// How many times `needle` was written.
    pub(crate) fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }
    /// Forgets what was written.
    pub(crate) fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// A subscriber of the events up to `level`, written into `logs` as plain text (spans shown
/// before each event, fields as `name=value`).
pub(crate) fn log_into(
    logs: &Logs,
    level: tracing::Level,
) -> impl tracing::Subscriber + Send + Sync {
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish()
}

/// Runs `f` with the events up to `INFO` written into the returned [`Logs`].
#[allow(dead_code)] // Not every test binary uses it.
pub(crate) fn capturing<T>(f: impl FnOnce() -> T) -> (T, Logs) {
    let logs = Logs::default();
    let out = tracing::subscriber::with_default(log_into(&logs, tracing::Level::INFO), f);
    (out, logs)
}

/// `tracing`'s level and interest caches are process-wide: a test that asserts what is logged (or
/// what is not) races the subscribers of the binary's other tests. Such a test starts with
/// `if !alone("module::test_name") { return; }`: in the test binary's own run this runs the test
/// again in a process of its own (one test, one thread) and asserts that it passed; in that
/// process it returns `true` and the test goes on.
#[allow(dead_code)] // Not every test binary uses it.
pub(crate) fn alone(test: &str) -> bool {
    const ALONE: &str = "TOLLGATE_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("1 passed"),
        "{test} did not run alone: {text}"
    );
    false
}
