//! A shaping TCP proxy: bandwidth (pacing), RTT (half each way), loss and byte counters per
//! direction, so experiments emulate 6G, 5G, Wi-Fi or constrained links on one machine,
//! reproducibly.
//!
//! Loss is modelled at the level TCP shows it to an application: a lost segment arrives one
//! retransmission timeout late (max(200 ms, 2 RTT)) and holds back everything behind it. The
//! draws come from a fixed-seed generator, so a run is repeatable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Profile {
    /// Bits per second each way; 0 = unlimited.
    pub bandwidth_bps: u64,
    pub rtt: Duration,
    /// Probability that a 16 KiB chunk needs a retransmission.
    pub loss: f64,
}

impl Profile {
    pub const UNLIMITED: Profile = Profile {
        bandwidth_bps: 0,
        rtt: Duration::ZERO,
        loss: 0.0,
    };

    /// Retransmission timeout applied to a lost chunk.
    pub fn rto(&self) -> Duration {
        (self.rtt * 2).max(Duration::from_millis(200))
    }

    /// Named profiles (rough medians of each access technology).
    pub fn named(name: &str) -> Option<Self> {
        let p = |mbit: u64, ms: u64| Profile {
            bandwidth_bps: mbit * 1_000_000,
            rtt: Duration::from_millis(ms),
            loss: 0.0,
        };
        Some(match name {
            "6g" => p(10_000, 1),
            "5g" => p(1_000, 10),
            "wifi" => p(300, 5),
            "4g" => p(50, 40),
            "constrained" => p(10, 50),
            "loopback" => Profile::UNLIMITED,
            _ => return None,
        })
    }

    /// Parse "100mbit", "1gbit", "500kbit" or a plain number of bits per second.
    pub fn parse_bandwidth(s: &str) -> Option<u64> {
        let s = s.trim().to_ascii_lowercase();
        let (num, mul) = if let Some(n) = s.strip_suffix("gbit") {
            (n, 1_000_000_000)
        } else if let Some(n) = s.strip_suffix("mbit") {
            (n, 1_000_000)
        } else if let Some(n) = s.strip_suffix("kbit") {
            (n, 1_000)
        } else {
            (s.as_str(), 1)
        };
        num.trim()
            .parse::<f64>()
            .ok()
            .map(|v| (v * mul as f64) as u64)
    }

    /// Time to put `bytes` on the wire.
    pub fn serialization(&self, bytes: usize) -> Duration {
        if self.bandwidth_bps == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(bytes as f64 * 8.0 / self.bandwidth_bps as f64)
        }
    }
}

#[derive(Debug, Default)]
pub struct Counters {
    pub up: AtomicU64,
    pub down: AtomicU64,
}

impl Counters {
    pub fn up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }
    pub fn down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }
}

/// A running link. `up` is client -> upstream (edge -> cloud), `down` the other way.
pub struct Link {
    pub addr: std::net::SocketAddr,
    pub counters: Arc<Counters>,
}

impl Link {
    pub async fn start(listen: &str, upstream: String, profile: Profile) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = match TcpStream::connect(&upstream).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("link: upstream {upstream}: {e}");
                        continue;
                    }
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, profile, c.clone(), true));
                tokio::spawn(pump(sr, cw, profile, c.clone(), false));
            }
        });
        Ok(Self { addr, counters })
    }
}

/// How far the reader may run ahead of the wire before it sleeps.
const PACE_SLACK: Duration = Duration::from_millis(2);

/// Copy one direction: each chunk leaves the wire after the ones before it (bandwidth) and
/// is delivered half an RTT later. Reading and delivering are separate tasks, so the latency
/// is paid once per chunk in flight, not once per chunk in sequence.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    p: Profile,
    c: Arc<Counters>,
    up: bool,
) {
    // Bounded: a full pipe pushes back on the sender like a real link's buffers.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(256);
    let deliver = tokio::spawn(async move {
        while let Some((at, bytes)) = rx.recv().await {
            // The timer ticks in milliseconds: a chunk already due goes out without a sleep.
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            if w.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut wire_free = Instant::now();
    let mut rng: u64 = if up {
        0x9E37_79B9_7F4A_7C15
    } else {
        0xD1B5_4A32_D192_ED03
    };
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let counter = if up { &c.up } else { &c.down };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        wire_free = wire_free.max(Instant::now()) + p.serialization(n);
        // Pace the reader to the wire so the buffer holds at most what is in flight. Sleep
        // only when ahead by more than the timer's millisecond tick (a sleep per chunk would
        // cap a fast link at one chunk per tick), and wake that much early, so a late wake-up
        // never leaves the wire idle.
        if wire_free > Instant::now() + PACE_SLACK {
            tokio::time::sleep_until(wire_free - PACE_SLACK).await;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let draw = (rng >> 11) as f64 / (1u64 << 53) as f64;
        let lost = p.loss > 0.0 && draw < p.loss;
        let late = if lost { p.rto() } else { Duration::ZERO };
        let at = wire_free + p.rtt / 2 + late;
        if tx.send((at, buf[..n].to_vec())).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = deliver.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_profiles_and_bandwidths() {
        assert_eq!(Profile::parse_bandwidth("100mbit"), Some(100_000_000));
        assert_eq!(Profile::parse_bandwidth("1.5gbit"), Some(1_500_000_000));
        assert_eq!(
            Profile::named("constrained").unwrap().bandwidth_bps,
            10_000_000
        );
        assert!(Profile::named("carrier-pigeon").is_none());
        let p = Profile::named("constrained").unwrap();
        assert_eq!(p.serialization(1_250_000), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn shapes_a_real_transfer() {
        // An echo-less sink upstream; 200 kB over 16 Mbit/s takes >= 100 ms plus RTT/2.
        let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = sink.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = sink.accept().await.unwrap();
            let mut v = Vec::new();
            s.read_to_end(&mut v).await.unwrap();
            s.write_all(&(v.len() as u64).to_le_bytes()).await.unwrap();
        });
        let p = Profile {
            bandwidth_bps: 16_000_000,
            rtt: Duration::from_millis(20),
            loss: 0.0,
        };
        let link = Link::start("127.0.0.1:0", up, p).await.unwrap();
        let mut s = TcpStream::connect(link.addr).await.unwrap();
        let t = Instant::now();
        s.write_all(&vec![1u8; 200_000]).await.unwrap();
        s.shutdown().await.unwrap();
        let mut n = [0u8; 8];
        s.read_exact(&mut n).await.unwrap();
        assert_eq!(u64::from_le_bytes(n), 200_000);
        // Lower bound only: the shaper may never be faster than the link it emulates.
        assert!(t.elapsed() >= Duration::from_millis(100));
        assert_eq!(link.counters.up(), 200_000);
        assert_eq!(link.counters.down(), 8);
    }
}

#[cfg(test)]
mod loss_tests {
    use super::*;

    #[tokio::test]
    async fn loss_delays_but_never_drops_or_reorders() {
        let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = sink.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = sink.accept().await.unwrap();
            let mut v = Vec::new();
            s.read_to_end(&mut v).await.unwrap();
            s.write_all(&v).await.unwrap();
        });
        let p = Profile {
            bandwidth_bps: 0,
            rtt: Duration::from_millis(2),
            loss: 0.5,
        };
        let link = Link::start("127.0.0.1:0", up, p).await.unwrap();
        let mut s = TcpStream::connect(link.addr).await.unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let t = Instant::now();
        s.write_all(&data).await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, data, "TCP semantics: everything arrives, in order");
        // With half the chunks lost, at least one retransmission timeout was paid.
        assert!(t.elapsed() >= p.rto());
    }
}
