//! Reloading a rules file: from text, from a file, or by watching it; what a reload changed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::file::{MAX_RULES_FILE_BYTES, RulesError};
use super::{Compiled, Rules, Shared};
use crate::Clock;
use crate::store::Store;

/// What a reload changed, by limit name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Limits new in the file.
    pub added: Vec<String>,
    /// Limits no longer in the file.
    pub removed: Vec<String>,
    /// Limits whose settings changed but whose state is kept (path, methods, cost, shadow,
    /// missing-key choice).
    pub changed: Vec<String>,
    /// Limits whose rule changed (quotas, strategy or window offset; same key): the store
    /// converts each key's state to the new rule when the key is next seen (see [`Rules`]).
    pub converted: Vec<String>,
    /// Limits whose key changed: their state starts fresh.
    pub fresh: Vec<String>,
}

impl ReloadReport {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && self.converted.is_empty()
            && self.fresh.is_empty()
    }
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "added {:?}, removed {:?}, changed {:?}, converted {:?}, started fresh {:?}",
            self.added, self.removed, self.changed, self.converted, self.fresh
        )
    }
}

impl<St: Store<Vec<u8>>, C: Clock + Clone> Rules<St, C> {
    /// Swaps in the rules of `text` if its content differs from the last loaded: `Ok(None)` when
    /// unchanged, the change log otherwise. Requests in flight finish on the old rules.
    ///
    /// # Errors
    /// [`RulesError`] for a file that cannot be used: the old rules stay (logged at `error` and
    /// counted in `tollgate_rules_reloads_total{result="error"}`).
    pub fn reload_text(&self, text: &str) -> Result<Option<ReloadReport>, RulesError> {
        self.reload(text).map(|(report, _old)| report)
    }

    /// [`Rules::reload_text`], handing back the rules it replaced (to be dropped off the request
    /// path: see [`retire`]).
    #[allow(clippy::type_complexity)]
    pub(super) fn reload(
        &self,
        text: &str,
    ) -> Result<(Option<ReloadReport>, Option<Arc<Compiled<St, C>>>), RulesError> {
        let hash = content_hash(text.as_bytes());
        let mut loaded = self.shared.loaded.lock();
        if *loaded == hash {
            return Ok((None, None));
        }
        let mut report = ReloadReport::default();
        let result = if text.trim().is_empty() {
            // What a reader sees between a writer's truncation and its write: never "no limits".
            Err(RulesError::whole(
                "the new rules file is empty (a file with no limits holds at least a comment)",
            ))
        } else {
            self.shared
                .parse(text)
                .and_then(|f| self.shared.compile(f, &mut report))
        };
        match result {
            Ok(compiled) => {
                let old = self.shared.current.swap(Arc::new(compiled));
                *loaded = hash;
                self.shared.reloads.ok.increment(1);
                tracing::info!(
                    added = ?report.added,
                    removed = ?report.removed,
                    changed = ?report.changed,
                    converted = ?report.converted,
                    fresh = ?report.fresh,
                    "rules reloaded"
                );
                for name in &report.fresh {
                    tracing::warn!(
                        limit = %name,
                        "rules reload: the key changed: the limit starts fresh"
                    );
                }
                Ok((Some(report), Some(old)))
            }
            Err(e) => {
                self.shared.reloads.error.increment(1);
                tracing::error!(error = %e, "rules reload refused; the old rules keep serving");
                Err(e)
            }
        }
    }

    /// [`Rules::reload_text`] with the content of `path`. A file that vanished or cannot be read
    /// is an error like any invalid file: the old rules stay.
    ///
    /// # Errors
    /// As [`Rules::reload_text`].
    pub fn reload_file(&self, path: &Path) -> Result<Option<ReloadReport>, RulesError> {
        match read_rules(path) {
            Ok(text) => self.reload_text(&text),
            Err(e) => {
                self.shared.reloads.error.increment(1);
                tracing::error!(error = %e, "rules reload refused; the old rules keep serving");
                Err(e)
            }
        }
    }

    /// Polls `path` every `every` (at least 50 ms) on the tokio runtime and reloads it when its
    /// content changes and then holds still for 25 ms (a file caught in the middle of an in-place
    /// write is not loaded; an empty one is refused). A new file is parsed and compiled on a
    /// blocking thread (requests go on meanwhile on the old rules) and swapped in at once. The
    /// task ends when every [`Rules`] handle and layer is dropped. A file
    /// that stays invalid is reported once per content, not once per poll.
    pub fn watch(&self, path: impl Into<PathBuf>, every: Duration) -> tokio::task::JoinHandle<()> {
        let path = path.into();
        let weak: Weak<Shared<St, C>> = Arc::downgrade(&self.shared);
        let every = every.max(Duration::from_millis(50));
        tokio::spawn(async move {
            let mut refused: Option<[u8; 32]> = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else { break };
                let rules = Rules { shared };
                rules.publish_stats();
                let text = match read_rules(&path) {
                    Ok(t) => t,
                    Err(e) => {
                        let hash = content_hash(e.message().as_bytes());
                        if refused != Some(hash) {
                            refused = Some(hash);
                            rules.shared.reloads.error.increment(1);
                            tracing::error!(error = %e, "rules reload refused; the old rules keep serving");
                        }
                        continue;
                    }
                };
                let hash = content_hash(text.as_bytes());
                if refused == Some(hash) || *rules.shared.loaded.lock() == hash {
                    continue;
                }
                // A change: read again a moment later and load only a content that held still,
                // so a file caught in the middle of an in-place write is not loaded.
                tokio::time::sleep(SETTLE_TIME).await;
                match read_rules(&path) {
                    Ok(again) if again == text => {}
                    _ => continue,
                }
                // Parsing and compiling a large file takes a while: on a blocking thread, so the
                // runtime's workers keep serving requests on the old rules until the swap.
                let compiling = rules.clone();
                let reload = move || {
                    let (result, old) = match compiling.reload(&text) {
                        Ok((_, old)) => (Ok(()), old),
                        Err(e) => (Err(e), None),
                    };
                    if let Some(old) = old {
                        retire(old);
                    }
                    result
                };
                match tokio::task::spawn_blocking(reload).await {
                    Ok(Ok(())) => refused = None,
                    Ok(Err(_)) => refused = Some(hash),
                    Err(e) => tracing::error!(error = %e, "rules reload failed to run"),
                }
            }
        })
    }
}

/// Drops the rules a reload replaced on this thread (a blocking one of [`Rules::watch`]), not
/// on a request's: freeing thousands of limits takes a while. Waits up to [`RETIRE_WAIT`] for the requests still deciding
/// on them; after that the last of them drops what is left.
pub(super) fn retire<T>(old: Arc<T>) {
    let start = std::time::Instant::now();
    while Arc::strong_count(&old) > 1 && start.elapsed() < RETIRE_WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(old);
}

/// How long a reload waits for the requests still on the rules it replaced (see [`retire`]).
pub(super) const RETIRE_WAIT: Duration = Duration::from_millis(200);

/// How long a changed rules file must keep the same content before it is loaded.
pub(super) const SETTLE_TIME: Duration = Duration::from_millis(25);

/// Reads a rules file, refusing one above [`MAX_RULES_FILE_BYTES`] before reading it whole.
pub(super) fn read_rules(path: &Path) -> Result<String, RulesError> {
    use std::io::Read as _;
    let fail = |e: &dyn std::fmt::Display| RulesError::whole(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| fail(&e))?;
    let mut text = String::new();
    file.take(MAX_RULES_FILE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| fail(&e))?;
    if text.len() > MAX_RULES_FILE_BYTES {
        return Err(fail(&format_args!(
            "larger than the {MAX_RULES_FILE_BYTES} bytes a rules file may have"
        )));
    }
    Ok(text)
}

pub(super) fn content_hash(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}
