//! Which key the edge checks the cloud's KV with: one it was given, one it pinned on first
//! contact and keeps like SSH's `known_hosts`, or none at all, by explicit choice.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use edgeprompt_kv::TrustKey;

/// How an edge learns the key that signs its cloud's KV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudTrust {
    /// This key (`--cloud-key`).
    Key(TrustKey),
    /// The key the cloud shows on first contact, pinned from then on: in this file (one
    /// `host:port key` line per cloud) when given, else for the life of the process.
    FirstUse(Option<PathBuf>),
    /// Unsigned KV is taken (`--allow-unsigned-kv`): forged values cannot be told apart.
    AllowUnsigned,
}

impl Default for CloudTrust {
    fn default() -> Self {
        CloudTrust::FirstUse(None)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error("the cloud at {cloud} now shows signing key {shown}, but this edge pinned {pinned} on first contact ({file}); if the cloud's key was changed on purpose, delete its line there (or give --cloud-key)")]
    Changed {
        cloud: String,
        pinned: String,
        shown: String,
        file: String,
    },
    #[error("the cloud at {0} signs nothing, and this edge takes only signed KV (--allow-unsigned-kv to take it anyway)")]
    Unsigned(String),
    #[error("the cloud at {0} has not been reached yet, so its signing key is not known")]
    Unknown(String),
    #[error("known clouds file {0}")]
    File(String),
}

/// The key in force for one cloud.
#[derive(Debug)]
pub struct Trust {
    mode: CloudTrust,
    /// The cloud as pinned: its URL's `host:port`.
    cloud: String,
    pinned: Mutex<Option<TrustKey>>,
    /// Set when the cloud showed another key than the pinned one (refused until fixed).
    changed: Mutex<Option<TrustError>>,
    /// How many times a conflict began: the KV the pinned key vouched for is dropped once per
    /// conflict.
    conflicts: std::sync::atomic::AtomicU64,
}

/// Most bytes of a known clouds file read.
const MAX_FILE: u64 = 1 << 20;

impl Trust {
    /// The trust for the cloud at `url`; with a known clouds file, its pinned key (if any) is
    /// read now, so an edge restarted without its cloud still checks its disk tier.
    pub fn new(mode: CloudTrust, url: Option<&str>) -> Result<Self, TrustError> {
        let cloud = url.map(authority).unwrap_or_default();
        let pinned = match &mode {
            CloudTrust::Key(k) => Some(*k),
            CloudTrust::FirstUse(Some(file)) if !cloud.is_empty() => read_known(file)?
                .into_iter()
                .find(|(c, _)| *c == cloud)
                .map(|x| x.1),
            _ => None,
        };
        Ok(Self {
            mode,
            cloud,
            pinned: Mutex::new(pinned),
            changed: Mutex::new(None),
            conflicts: Default::default(),
        })
    }

    /// The cloud now shows another key than the pinned one: one of them is not the cloud's,
    /// and this edge cannot tell which (until an operator says: `edgeprompt trust`).
    pub fn conflict(&self) -> Option<TrustError> {
        lock(&self.changed).clone()
    }

    /// How many conflicts began so far.
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether KV must carry the cloud's signature to be used.
    pub fn requires_signature(&self) -> bool {
        self.mode != CloudTrust::AllowUnsigned
    }

    /// The key to check KV with: `Ok(None)` only when unsigned KV is allowed.
    pub fn key(&self) -> Result<Option<TrustKey>, TrustError> {
        if self.mode == CloudTrust::AllowUnsigned {
            return Ok(None);
        }
        if let Some(e) = lock(&self.changed).clone() {
            return Err(e);
        }
        lock(&self.pinned)
            .map(Some)
            .ok_or_else(|| TrustError::Unknown(self.cloud.clone()))
    }

    /// Whether a key is known without asking the cloud.
    pub fn known(&self) -> bool {
        self.mode == CloudTrust::AllowUnsigned || lock(&self.pinned).is_some()
    }

    /// The key a list from a cloud showing `shown` must be signed by, pinning nothing: the
    /// configured or pinned key, or on first contact the shown one (pinned by `learn` only
    /// once its list verified). With unsigned KV allowed, the shown key if any.
    pub fn list_key(&self, shown: Option<TrustKey>) -> Result<Option<TrustKey>, TrustError> {
        match &self.mode {
            CloudTrust::AllowUnsigned => Ok(shown),
            CloudTrust::Key(k) => Ok(Some(*k)),
            CloudTrust::FirstUse(_) => match *lock(&self.pinned) {
                Some(p) => Ok(Some(p)),
                None => shown
                    .map(Some)
                    .ok_or_else(|| TrustError::Unsigned(self.cloud.clone())),
            },
        }
    }

    /// The cloud showed `shown` (from its list): pinned on first contact; a different key
    /// from the pinned one is refused from now on, naming both.
    pub fn learn(&self, shown: Option<TrustKey>) -> Result<(), TrustError> {
        let file = match &self.mode {
            CloudTrust::AllowUnsigned => return Ok(()),
            CloudTrust::Key(k) => {
                if shown.is_some_and(|s| s != *k) {
                    tracing::warn!(
                        "the cloud at {} shows key {}, not the configured {}: its KV will be refused",
                        self.cloud,
                        shown.map_or(String::new(), |s| s.short()),
                        k.short()
                    );
                }
                return Ok(());
            }
            CloudTrust::FirstUse(file) => file,
        };
        let Some(shown) = shown else {
            return Err(TrustError::Unsigned(self.cloud.clone()));
        };
        let mut pinned = lock(&self.pinned);
        match *pinned {
            Some(p) if p == shown => {
                *lock(&self.changed) = None;
                Ok(())
            }
            Some(p) => {
                let e = TrustError::Changed {
                    cloud: self.cloud.clone(),
                    pinned: p.to_hex(),
                    shown: shown.to_hex(),
                    file: file
                        .as_ref()
                        .map_or("in memory".into(), |f| f.display().to_string()),
                };
                let mut changed = lock(&self.changed);
                if changed.is_none() {
                    self.conflicts
                        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
                *changed = Some(e.clone());
                Err(e)
            }
            None => {
                if let Some(f) = file {
                    append_known(f, &self.cloud, &shown)?;
                }
                tracing::warn!(
                    "trusting the cloud at {} on first contact: its KV must be signed by {} from now on{}",
                    self.cloud,
                    shown.short(),
                    file.as_ref()
                        .map_or(String::new(), |f| format!(" (pinned in {})", f.display()))
                );
                *pinned = Some(shown);
                Ok(())
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `host:port` of a URL, the host in lower case and the scheme's port made explicit (the URL
/// itself if it has no host): what a pin names.
fn authority(url: &str) -> String {
    let Ok(u) = url.parse::<tonic::codegen::http::Uri>() else {
        return url.to_string();
    };
    let Some(host) = u.host() else {
        return url.to_string();
    };
    let port = u.port_u16().unwrap_or(if u.scheme_str() == Some("https") {
        443
    } else {
        80
    });
    format!("{}:{port}", host.to_ascii_lowercase())
}

/// The pins of a known clouds file (none if it does not exist). Opened as a regular file,
/// bounded; a line that does not parse is an error, not skipped: it may be the cloud's pin.
fn read_known(file: &Path) -> Result<Vec<(String, TrustKey)>, TrustError> {
    let err = |m: String| TrustError::File(format!("{}: {m}", file.display()));
    let f = match edgeprompt_kv::store::open_regular(file) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(err(e.to_string())),
    };
    let mut text = String::new();
    f.take(MAX_FILE)
        .read_to_string(&mut text)
        .map_err(|e| err(e.to_string()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || err(format!("line {}: not `host:port key`", n + 1));
        let (cloud, key) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
        let key = TrustKey::from_hex(key.trim()).map_err(|_| bad())?;
        out.push((cloud.to_string(), key));
    }
    Ok(out)
}

/// The pins of a known clouds file, `host:port` and key each (what `edgeprompt trust` shows).
pub fn pins(file: &Path) -> Result<Vec<(String, TrustKey)>, TrustError> {
    read_known(file)
}

/// Pin `key` for the cloud at `url` (`Some`) or forget its pin (`None`), out of band (for
/// deployments that provision keys, and to settle a conflict): the file rewritten whole with
/// that cloud's line replaced, through a temporary file renamed over it. Returns the key
/// pinned before, if any.
pub fn set_pin(
    file: &Path,
    url: &str,
    key: Option<&TrustKey>,
) -> Result<Option<TrustKey>, TrustError> {
    let cloud = authority(url);
    let err = |e: std::io::Error| TrustError::File(format!("{}: {e}", file.display()));
    let known = read_known(file)?;
    let before = known.iter().find(|(c, _)| *c == cloud).map(|x| x.1);
    let mut text = String::from("# host:port key, one cloud a line (edgeprompt trust)\n");
    for (c, k) in known.iter().filter(|(c, _)| *c != cloud) {
        text.push_str(&format!("{c} {}\n", k.to_hex()));
    }
    if let Some(k) = key {
        text.push_str(&format!("{cloud} {}\n", k.to_hex()));
    }
    let dir = match file.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d,
        None => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(err)?;
    tmp.write_all(text.as_bytes()).map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(file).map_err(|e| err(e.error))?;
    Ok(before)
}

/// One line added, written at once (edges sharing the file do not interleave), to a regular
/// file only (never through a symlink, never blocking on a FIFO).
fn append_known(file: &Path, cloud: &str, key: &TrustKey) -> Result<(), TrustError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: std::io::Error| TrustError::File(format!("{}: {e}", file.display()));
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)
        .map_err(err)?;
    if !f.metadata().map_err(err)?.file_type().is_file() {
        return Err(err(std::io::Error::other("not a regular file")));
    }
    f.write_all(format!("{cloud} {}\n", key.to_hex()).as_bytes())
        .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeprompt_kv::SealKey;

    fn key(b: u8) -> TrustKey {
        SealKey::from_seed([b; 32]).public()
    }

    #[test]
    fn the_first_key_is_pinned_in_the_file_and_a_changed_one_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("known_clouds");
        let url = "http://10.0.0.7:50051";
        let t = Trust::new(CloudTrust::FirstUse(Some(file.clone())), Some(url)).unwrap();
        assert!(matches!(t.key(), Err(TrustError::Unknown(_))));
        assert!(matches!(t.learn(None), Err(TrustError::Unsigned(_))));
        t.learn(Some(key(1))).unwrap();
        assert_eq!(t.key(), Ok(Some(key(1))));
        // A restarted edge reads the pin before it reaches the cloud.
        let again = Trust::new(CloudTrust::FirstUse(Some(file.clone())), Some(url)).unwrap();
        assert_eq!(again.key(), Ok(Some(key(1))));
        let e = again.learn(Some(key(2))).unwrap_err().to_string();
        assert!(
            e.contains(&key(1).to_hex()) && e.contains(&key(2).to_hex()),
            "{e}"
        );
        assert!(again.key().is_err(), "refused until the pin is fixed");
        // Another cloud gets its own pin.
        let other = Trust::new(
            CloudTrust::FirstUse(Some(file.clone())),
            Some("http://10.0.0.8:50051"),
        );
        assert!(matches!(other.unwrap().key(), Err(TrustError::Unknown(_))));
        // The same cloud however its URL is spelt.
        let same = Trust::new(
            CloudTrust::FirstUse(Some(file)),
            Some("HTTP://10.0.0.7:50051/"),
        );
        assert_eq!(same.unwrap().key(), Ok(Some(key(1))));
        assert_eq!(authority("https://Cloud.Example"), "cloud.example:443");
    }

    #[test]
    fn pins_are_provisioned_replaced_and_forgotten_out_of_band() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state/known_clouds");
        let (a, b) = ("http://10.0.0.7:50051", "https://cloud.example");
        assert_eq!(set_pin(&file, a, Some(&key(1))).unwrap(), None);
        assert_eq!(set_pin(&file, b, Some(&key(2))).unwrap(), None);
        // A conflict settled for the key the cloud shows now.
        assert_eq!(set_pin(&file, a, Some(&key(3))).unwrap(), Some(key(1)));
        let mut p = pins(&file).unwrap();
        p.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            p,
            [
                ("10.0.0.7:50051".to_string(), key(3)),
                ("cloud.example:443".to_string(), key(2))
            ]
        );
        // An edge reads the provisioned pin.
        let t = Trust::new(CloudTrust::FirstUse(Some(file.clone())), Some(a)).unwrap();
        assert_eq!(t.key(), Ok(Some(key(3))));
        assert_eq!(set_pin(&file, a, None).unwrap(), Some(key(3)));
        assert_eq!(pins(&file).unwrap().len(), 1);
    }

    #[test]
    fn a_given_key_and_the_unsigned_opt_out() {
        let t = Trust::new(CloudTrust::Key(key(3)), Some("http://127.0.0.1:1")).unwrap();
        assert_eq!(t.key(), Ok(Some(key(3))));
        t.learn(Some(key(4))).unwrap();
        assert_eq!(
            t.key(),
            Ok(Some(key(3))),
            "the configured key stays the one checked"
        );
        let u = Trust::new(CloudTrust::AllowUnsigned, Some("http://127.0.0.1:1")).unwrap();
        assert!(!u.requires_signature());
        assert_eq!(u.key(), Ok(None));
    }

    #[test]
    fn a_broken_known_clouds_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("known_clouds");
        std::fs::write(&file, "10.0.0.7:50051 not-a-key\n").unwrap();
        assert!(Trust::new(
            CloudTrust::FirstUse(Some(file)),
            Some("http://10.0.0.7:50051")
        )
        .is_err());
    }
}
