//! What the cloud publishes: its prompts' ids, token counts and content addresses for this
//! edge's model, and its signing key. The edge matches system messages against this list on
//! its own and asks the cloud and peers only for what is on it, so nothing of a private system
//! message (not its text, ids, length or address) is ever named on a link.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use edgeprompt_engine::Model;
use edgeprompt_kv::TrustKey;

use crate::client::{Listed, HEADER_TIMEOUT};
use crate::trust::{CloudTrust, Trust, TrustError};
use crate::{ClientSecurity, CloudClient};

/// How long a list is used before the cloud is asked again (asked on any request after that,
/// whatever the request holds: when it is asked tells nothing of what is asked).
pub const LIST_TTL: Duration = Duration::from_secs(5);

/// The cloud's published prompts.
#[derive(Debug, Default)]
pub struct Published {
    pub prompts: Vec<Listed>,
    by_address: HashMap<String, usize>,
    by_id: HashMap<String, usize>,
}

impl Published {
    fn new(prompts: Vec<Listed>) -> Self {
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

pub struct Catalog {
    url: Option<String>,
    security: ClientSecurity,
    model: Arc<Model>,
    trust: Trust,
    timeout: Duration,
    /// One asking at a time; pages and clients cannot spend the edge's budget at the cloud.
    asked: tokio::sync::Mutex<Option<Asked>>,
    /// The last list the cloud gave (kept while it cannot be asked).
    last: RwLock<Option<Arc<Published>>>,
}

impl Catalog {
    pub fn new(
        model: Arc<Model>,
        url: Option<String>,
        security: ClientSecurity,
        trust: CloudTrust,
    ) -> Result<Self, TrustError> {
        Ok(Self {
            trust: Trust::new(trust, url.as_deref())?,
            url,
            security,
            model,
            timeout: HEADER_TIMEOUT,
            asked: tokio::sync::Mutex::new(None),
            last: RwLock::new(None),
        })
    }

    /// Give up on the cloud's list after `t`.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// The list as last received (empty before the first).
    pub fn current(&self) -> Arc<Published> {
        self.last
            .read()
            .ok()
            .and_then(|l| l.clone())
            .unwrap_or_default()
    }

    /// The cloud's list, asked again when the last asking is older than `LIST_TTL`; while the
    /// cloud cannot be asked, the last list it gave. `Err` only when it never gave one.
    pub async fn refresh(&self) -> Result<Arc<Published>, String> {
        let Some(url) = &self.url else {
            return Ok(Default::default());
        };
        let mut asked = self.asked.lock().await;
        let fresh = asked.as_ref().is_some_and(|a| a.at.elapsed() < LIST_TTL);
        if !fresh {
            let got = async {
                let c = CloudClient::connect_with(url, &self.security).await?;
                c.header_timeout(self.timeout).list(&self.model).await
            };
            let error = match tokio::time::timeout(self.timeout, got).await {
                Ok(Ok(listing)) => {
                    if let Err(e) = self.trust.learn(listing.key) {
                        tracing::error!("{e}");
                    }
                    // Only a list the trusted key signed says what is public: a forged one
                    // could list the address of a guessed private message.
                    let fp = &self.model.fingerprint;
                    let checked = match self.trust.key() {
                        Ok(key) => listing
                            .signed_by(key.as_ref(), fp)
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    match checked {
                        Ok(prompts) => {
                            if let Ok(mut l) = self.last.write() {
                                *l = Some(Arc::new(Published::new(prompts.to_vec())));
                            }
                            None
                        }
                        Err(e) => Some(e),
                    }
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!(
                    "the cloud did not list its prompts within {:?}",
                    self.timeout
                )),
            };
            if let Some(e) = &error {
                tracing::info!("the cloud's list of prompts: {e}");
            }
            *asked = Some(Asked {
                at: Instant::now(),
                error,
            });
        }
        match (
            self.last.read().ok().and_then(|l| l.clone()),
            asked.as_ref(),
        ) {
            (Some(p), _) => Ok(p),
            (None, Some(Asked { error: Some(e), .. })) => Err(e.clone()),
            (None, _) => Ok(Default::default()),
        }
    }

    /// The key KV from this cloud must be signed by (`None`: unsigned KV allowed). Asks the
    /// cloud's list first when the key is not known yet (trust on first use).
    pub async fn key(&self) -> Result<Option<TrustKey>, TrustError> {
        if !self.trust.known() {
            let _ = self.refresh().await;
        }
        self.trust.key()
    }
}
