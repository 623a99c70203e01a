//! Key extractors registered in code by name, so that a rules file can use them (`key = "user"`,
//! `tier = "plan"`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::request::Parts;

use crate::key::{KeyError, KeyExtractor};
use crate::store::StoreKey;

/// A registered extractor, its key as bytes (the key's [`StoreKey`] encoding).
type Extract = Arc<dyn Fn(&Parts) -> Result<Vec<u8>, KeyError> + Send + Sync>;

/// Key extractors by name ([`RulesOptions::key`](super::RulesOptions::key)): what a rules file's
/// `key = "NAME"` (alone or in a composite) and `tier = "NAME"` read. A file naming one that is
/// not registered is refused at load.
#[derive(Clone, Default)]
pub struct NamedKeys {
    by_name: HashMap<Box<str>, Extract>,
}

impl NamedKeys {
    /// Registers `extractor` as `name` (`[a-z0-9_-]{1,64}`, not `ip` or `global`), replacing one of
    /// that name.
    ///
    /// # Errors
    /// A [`RulesError`](super::RulesError) for another name.
    pub fn insert<X: KeyExtractor>(
        &mut self,
        name: &str,
        extractor: X,
    ) -> Result<(), super::RulesError> {
        if !super::file::is_extractor_name(name) {
            return Err(super::RulesError::whole(format!(
                "key name {name:?}: a registered key's name is [a-z0-9_-]{{1,64}}, and not ip or \
                 global"
            )));
        }
        let extract: Extract = Arc::new(move |parts: &Parts| {
            let key = extractor.extract(parts)?;
            let mut out = Vec::new();
            key.encode(&mut out);
            Ok(out)
        });
        self.by_name.insert(name.into(), extract);
        Ok(())
    }

    /// Whether an extractor of this name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The key the extractor `name` reads from `parts`, encoded.
    pub(crate) fn extract(&self, name: &str, parts: &Parts) -> Result<Vec<u8>, KeyError> {
        match self.by_name.get(name) {
            Some(extract) => extract(parts),
            None => Err(KeyError::new("no key extractor of this name is registered")),
        }
    }

    /// The registered names, sorted (for error messages).
    pub(crate) fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_name.keys().map(|n| &**n).collect();
        names.sort_unstable();
        names
    }
}

impl fmt::Debug for NamedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}
