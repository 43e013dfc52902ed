//! What the cloud publishes: its prompts' ids, token counts and content addresses for this
//! edge's model, and its signing key. The edge matches system messages against this list on
//! its own and asks the cloud and peers only for what is on it, so nothing of a private system
//! message (not its text, ids, length or address) is ever named on a link.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use edgeprompt_engine::Model;
use edgeprompt_kv::TrustKey;

use crate::client::Listed;
use crate::trust::{CloudTrust, Trust, TrustError};
use crate::{ClientSecurity, CloudClient};

/// How long a list is used before the cloud is asked again (asked on any request after that,
/// whatever the request holds: when it is asked tells nothing of what is asked).
pub const LIST_TTL: Duration = Duration::from_secs(5);

/// How soon a failed asking is tried again while the cloud has never given a list.
const RETRY: Duration = Duration::from_secs(1);
/// The background asking backs off, doubling, to this (a cloud down for long, or refused for a
/// changed key, is then asked, and logged, a few times a minute; requests still ask every
/// `RETRY`).
const RETRY_MAX: Duration = Duration::from_secs(10);

/// The cloud's published prompts.
#[derive(Debug, Default)]
pub struct Published {
    pub prompts: Vec<Listed>,
    /// Where the cloud's signed list says the published prompts' objects are.
    pub store: Option<String>,
    by_address: HashMap<String, usize>,
    by_id: HashMap<String, usize>,
}

impl Published {
    fn new(prompts: Vec<Listed>, store: Option<String>) -> Self {
        let by_address = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (p.address.clone(), i))
            .collect();
        let by_id = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.clone(), i))
            .collect();
        Self {
            prompts,
            store,
            by_address,
            by_id,
        }
    }

    /// The published prompt at this content address (hex).
    pub fn at(&self, address: &str) -> Option<&Listed> {
        self.by_address.get(address).map(|&i| &self.prompts[i])
    }

    pub fn named(&self, id: &str) -> Option<&Listed> {
        self.by_id.get(id).map(|&i| &self.prompts[i])
    }
}

/// The last list asked for: when, and why it failed if it did.
struct Asked {
    at: Instant,
    error: Option<String>,
}

/// What the edge knows of its cloud's list (shared with a refresh running behind requests).
struct Inner {
    url: Option<String>,
    /// The same service's other endpoints, asked in turn when `url` does not answer.
    replicas: Vec<String>,
    security: ClientSecurity,
    model: Arc<Model>,
    trust: Trust,
    timeout: Duration,
    /// One asking at a time; pages and clients cannot spend the edge's budget at the cloud.
    asked: tokio::sync::Mutex<Option<Asked>>,
    /// A refresh runs behind the requests.
    refreshing: AtomicBool,
    /// The first asking is over (answered or not).
    asked_once: AtomicBool,
    /// When the cloud was last asked (read without waiting on an asking in progress).
    asked_at: std::sync::Mutex<Option<Instant>>,
    /// The last list the cloud gave (kept while it cannot be asked).
    last: RwLock<Option<Arc<Published>>>,
    /// The published ids this edge takes at all (none: every one).
    allow: Option<Vec<String>>,
    /// When the newest list taken was issued (ms since the Unix epoch): an older one is a
    /// replay.
    newest: std::sync::Mutex<Option<u64>>,
}

pub struct Catalog(Arc<Inner>);

impl Catalog {
    pub fn new(
        model: Arc<Model>,
        url: Option<String>,
        replicas: Vec<String>,
        security: ClientSecurity,
        trust: CloudTrust,
        timeout: Duration,
        allow: Option<Vec<String>>,
    ) -> Result<Self, TrustError> {
        Ok(Self(Arc::new(Inner {
            trust: Trust::new(trust, url.as_deref())?,
            url,
            replicas,
            security,
            model,
            timeout,
            asked: tokio::sync::Mutex::new(None),
            refreshing: AtomicBool::new(false),
            asked_once: AtomicBool::new(false),
            asked_at: std::sync::Mutex::new(None),
            last: RwLock::new(None),
            allow,
            newest: std::sync::Mutex::new(None),
        })))
    }

    pub fn trust(&self) -> &Trust {
        &self.0.trust
    }

    /// The list as last received (empty before the first).
    pub fn current(&self) -> Arc<Published> {
        self.0.last().unwrap_or_default()
    }

    /// The cloud's list. Only the edge's very first asking is waited for (bounded by the
    /// header deadline); after it, requests get the last list at once (`Err` while the cloud
    /// never gave one), and a list older than `LIST_TTL` is asked again behind them, so a
    /// cloud that is down or silent delays no request.
    pub async fn refresh(&self) -> Result<Arc<Published>, String> {
        let inner = &self.0;
        if inner.url.is_none() {
            return Ok(Default::default());
        }
        if !inner.asked_once.load(Ordering::Acquire) {
            inner.ask_if_stale().await;
            if !inner.asked_once.swap(true, Ordering::AcqRel) && inner.last().is_none() {
                // The cloud did not answer the edge's first asking (often: started after the
                // edge). Asked again, from every `RETRY` backing off to `RETRY_MAX`, until it
                // gives a list, requests or not.
                let watch = Arc::downgrade(inner);
                tokio::spawn(async move {
                    let mut wait = RETRY;
                    loop {
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(RETRY_MAX);
                        let Some(inner) = watch.upgrade() else { return };
                        if inner.last().is_some() {
                            return;
                        }
                        inner.ask_if_stale().await;
                    }
                });
            }
        } else if inner.stale() && !inner.refreshing.swap(true, Ordering::AcqRel) {
            let behind = inner.clone();
            tokio::spawn(async move {
                behind.ask_if_stale().await;
                behind.refreshing.store(false, Ordering::Release);
            });
        }
        match inner.last() {
            Some(p) => Ok(p),
            None => Err(inner
                .last_error()
                .unwrap_or_else(|| "the cloud has given no list yet".into())),
        }
    }

    /// The key KV from this cloud must be signed by (`None`: unsigned KV allowed). Asks the
    /// cloud's list first when the key is not known yet (trust on first use).
    pub async fn key(&self) -> Result<Option<TrustKey>, TrustError> {
        if !self.0.trust.known() {
            let _ = self.refresh().await;
        }
        self.0.trust.key()
    }
}

impl Inner {
    /// Whether a list issued `at` may be taken: within its age (either way: a clock far ahead
    /// is as wrong as one far behind), and no older than the newest list taken. Taken, it
    /// becomes the newest. A list without a time passes only where signatures are not
    /// required (`signed_by` refuses a signed one without it).
    fn fresh(&self, at: Option<edgeprompt_kv::Issued>) -> Result<(), String> {
        let Some(at) = at else { return Ok(()) };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let age = u64::from(at.max_age_secs) * 1000;
        let refuse = |why: String| {
            tracing::error!("the cloud's list of prompts refused: {why}");
            Err(why)
        };
        if now.saturating_sub(at.unix_ms) > age || at.unix_ms.saturating_sub(now) > age {
            return refuse(format!(
                "it was issued {} s from now, outside its maximum age of {} s (a replayed \
                 list, or a clock that is off)",
                (at.unix_ms as i128 - now as i128) / 1000,
                at.max_age_secs
            ));
        }
        let mut newest = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        if newest.is_some_and(|n| at.unix_ms < n) {
            return refuse(format!(
                "it was issued {} ms before a list already taken (a replayed list)",
                newest.unwrap_or(0) - at.unix_ms
            ));
        }
        *newest = Some(at.unix_ms);
        Ok(())
    }

    fn last(&self) -> Option<Arc<Published>> {
        self.last.read().ok().and_then(|l| l.clone())
    }

    /// Whether the last asking is older than `LIST_TTL` (`RETRY` while the cloud never gave a
    /// list: an edge started before its cloud finds the cloud soon after it comes up).
    fn stale(&self) -> bool {
        let ttl = if self.last().is_some() {
            LIST_TTL
        } else {
            RETRY
        };
        self.asked_at
            .lock()
            .map_or(true, |a| a.is_none_or(|at| at.elapsed() >= ttl))
    }

    /// Why the last asking failed (none while an asking runs, or if it did not fail).
    fn last_error(&self) -> Option<String> {
        let asked = self.asked.try_lock().ok()?;
        asked.as_ref().and_then(|a| a.error.clone())
    }

    /// Ask the cloud for its list unless the last asking is younger than `LIST_TTL`; the
    /// last asking's error, if it failed.
    async fn ask_if_stale(&self) -> Option<String> {
        let mut asked = self.asked.lock().await;
        let ttl = if self.last().is_some() {
            LIST_TTL
        } else {
            RETRY
        };
        if let Some(a) = asked.as_ref().filter(|a| a.at.elapsed() < ttl) {
            return a.error.clone();
        }
        let error = self.ask().await.err();
        if let Some(e) = &error {
            tracing::info!("the cloud's list of prompts: {e}");
        }
        let now = Instant::now();
        *asked = Some(Asked {
            at: now,
            error: error.clone(),
        });
        if let Ok(mut a) = self.asked_at.lock() {
            *a = Some(now);
        }
        error
    }

    /// One asking: the first list the trusted key signed, of the endpoints in turn (a
    /// replica that does not answer, or whose list is refused, is followed by the next).
    async fn ask(&self) -> Result<(), String> {
        let mut tried = Vec::new();
        for url in self.url.iter().chain(&self.replicas) {
            let got = async {
                let c = CloudClient::connect_with(url, &self.security).await?;
                c.header_timeout(self.timeout).list(&self.model).await
            };
            match tokio::time::timeout(self.timeout, got).await {
                Ok(Ok(l)) => match self.take(l) {
                    Ok(()) => return Ok(()),
                    Err(e) => tried.push(format!("{url}: {e}")),
                },
                Ok(Err(e)) => tried.push(format!("{url}: {e}")),
                Err(_) => tried.push(format!(
                    "{url} did not list its prompts within {:?}",
                    self.timeout
                )),
            }
        }
        Err(tried.join("; "))
    }

    /// Keep `listing` if the trusted key signed it.
    fn take(&self, listing: crate::client::Listing) -> Result<(), String> {
        // Only a list the trusted key signed says what is public: a forged one could list
        // the address of a guessed private message. On first contact the shown key is pinned
        // only once its own list verified.
        let learn = |shown| {
            self.trust.learn(shown).map_err(|e| {
                tracing::error!("{e}");
                e.to_string()
            })
        };
        let pinned = self.trust.known();
        if pinned {
            // A changed key is refused naming both keys.
            learn(listing.key)?;
        }
        let key = self
            .trust
            .list_key(listing.key)
            .map_err(|e| e.to_string())?;
        let prompts = listing
            .signed_by(key.as_ref(), &self.model.fingerprint)
            .map_err(|e| e.to_string())?;
        self.fresh(listing.issued)?;
        if !pinned {
            learn(listing.key)?;
        }
        // A cloud could publish the address of a guessed private message and watch who asks:
        // an edge told which prompts it serves takes no others.
        let prompts: Vec<Listed> = prompts
            .iter()
            .filter(|p| self.allow.as_ref().is_none_or(|a| a.contains(&p.id)))
            .cloned()
            .collect();
        let store = listing
            .store(key.as_ref(), &self.model.fingerprint)
            .map(String::from);
        if let Ok(mut l) = self.last.write() {
            *l = Some(Arc::new(Published::new(prompts, store)));
        }
        Ok(())
    }
}
