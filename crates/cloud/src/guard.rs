//! Who may fetch, and how much: a bearer token (when configured), a per-client request rate
//! (token bucket by IP) and a cap on concurrent streams. A refused fetch gets a clear status and
//! costs the node nothing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Status};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// KV streams served at once; more are refused (`RESOURCE_EXHAUSTED`).
    pub max_streams: usize,
    /// Sustained fetches per second per client IP.
    pub per_client_rate: f64,
    /// Fetches a client may make at once before the rate applies.
    pub per_client_burst: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_streams: 256,
            per_client_rate: 50.0,
            per_client_burst: 100.0,
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct Guard {
    limits: Limits,
    /// The bearer token fetches must carry; never logged.
    token: Option<String>,
    streams: Arc<Semaphore>,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

impl Guard {
    pub fn new(limits: Limits, token: Option<String>) -> Self {
        Self {
            streams: Arc::new(Semaphore::new(limits.max_streams.max(1))),
            limits,
            token,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Check one fetch. The permit holds a stream slot until it is dropped.
    pub fn admit<T>(&self, req: &Request<T>) -> Result<OwnedSemaphorePermit, Status> {
        self.check(req)?;
        self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "the cloud is serving its maximum of {} streams; retry later",
                self.limits.max_streams
            ))
        })
    }

    /// Check one request that holds no stream: the token and the client's rate.
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        if let Some(want) = &self.token {
            let got = req
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !got.is_some_and(|g| same(g.as_bytes(), want.as_bytes())) {
                return Err(Status::unauthenticated(
                    "this cloud requires a valid bearer token",
                ));
            }
        }
        if let Some(ip) = req.remote_addr().map(|a| a.ip()) {
            self.take(ip)?;
        }
        Ok(())
    }

    fn take(&self, ip: IpAddr) -> Result<(), Status> {
        let mut b = match self.buckets.lock() {
            Ok(b) => b,
            Err(p) => p.into_inner(),
        };
        let now = Instant::now();
        let l = self.limits;
        let bucket = b.entry(ip).or_insert(Bucket {
            tokens: l.per_client_burst,
            at: now,
        });
        let refill = (now - bucket.at).as_secs_f64() * l.per_client_rate;
        bucket.tokens = (bucket.tokens + refill).min(l.per_client_burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Err(Status::resource_exhausted(format!(
                "rate limit: {} fetches per second per client",
                l.per_client_rate
            )));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }
}

/// Equal without an early exit, so timing does not reveal how much of a token matched.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(token: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(t) = token {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        r
    }

    #[test]
    fn token_is_required_when_configured() {
        let g = Guard::new(Limits::default(), Some("s3cret".into()));
        assert_eq!(
            g.admit(&req(None)).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            g.admit(&req(Some("wrong"))).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert!(g.admit(&req(Some("s3cret"))).is_ok());
        assert!(Guard::new(Limits::default(), None)
            .admit(&req(None))
            .is_ok());
    }

    #[test]
    fn streams_are_capped_and_given_back() {
        let g = Guard::new(
            Limits {
                max_streams: 2,
                ..Limits::default()
            },
            None,
        );
        let a = g.admit(&req(None)).unwrap();
        let _b = g.admit(&req(None)).unwrap();
        assert_eq!(
            g.admit(&req(None)).unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        drop(a);
        assert!(g.admit(&req(None)).is_ok());
    }

    #[test]
    fn a_client_over_its_rate_is_refused() {
        let g = Guard::new(
            Limits {
                per_client_rate: 0.001,
                per_client_burst: 3.0,
                ..Limits::default()
            },
            None,
        );
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        for _ in 0..3 {
            g.take(ip).unwrap();
        }
        assert_eq!(
            g.take(ip).unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        // Another client is not affected.
        g.take("10.0.0.8".parse().unwrap()).unwrap();
    }
}
