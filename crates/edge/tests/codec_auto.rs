//! `--codec auto` over a real shaped link: the first fetch, with nothing measured, is f16 and
//! measures the link; on a 10 Mbit/s link the next fetch takes the smallest codec whose
//! measured agreement passes the floor, never one below it; the choices show in `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use edgeprompt_edge::codec_choice::AutoCodec;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::prefixes::{PrefixConfig, UnknownSystem};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_link::{Link, Profile};

use crate::common;
use common::{model, start_cloud};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_codec_follows_the_measured_link_within_the_quality_floor() {
    let m = model();
    let cloud = start_cloud(m.clone()).await;
    let upstream = cloud.trim_start_matches("http://").to_string();
    let link = Link::start(
        "127.0.0.1:0",
        upstream,
        Profile::named("constrained").unwrap(),
    )
    .await
    .unwrap();
    // A quality table for this model: int8ch passes the floor, int4 does not.
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("codecs.json");
    let row = |codec: &str, ratio: f64, agreement: f64| {
        serde_json::json!({"model": m.cfg.name, "codec": codec, "ratio_vs_f16": ratio,
                           "next_token_agreement": agreement, "identical_64": 0.9, "pairs": 20})
    };
    let rows = vec![row("int8ch", 1.9, 0.995), row("int4", 3.2, 0.86)];
    std::fs::write(&table, serde_json::json!({ "rows": rows }).to_string()).unwrap();
    let auto = Arc::new(AutoCodec::from_table(&table, &m.cfg.name, 0.99).unwrap());
    assert_eq!(auto.allowed().len(), 1);
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 4,
            api_keys: Default::default(),
        },
        SchedulerConfig::default(),
        PrefixConfig {
            unknown_system: UnknownSystem::Refuse,
            auto_codec: Some(auto.clone()),
            ..common::prefix_config(&format!("http://{}", link.addr))
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, state));
    let metrics = tokio::task::spawn_blocking(move || {
        for prompt in ["support", "coding"] {
            let body = serde_json::json!({
                "model": "smollm2", "prompt": "Hello", "cloud_prompt": prompt,
                "max_tokens": 4, "temperature": 0
            });
            let (status, v) = common::post_json(addr, "/v1/completions", &body.to_string());
            assert_eq!(status, 200, "{v}");
        }
        common::http(addr, "GET", "/metrics", "").1
    })
    .await
    .unwrap();
    let link_est = auto.link().expect("the first fetch measured the link");
    // 10 Mbit/s shaped: the estimate is that, not the loopback's speed.
    assert!(
        link_est.bytes_per_sec < 2.5e6 && link_est.rtt >= Duration::from_millis(25),
        "{link_est:?}"
    );
    let count = |codec: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "edgeprompt_codec_choices_total{{codec=\"{codec}\"}}"
                ))
            })
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(count("f16"), 1.0, "{metrics}");
    assert_eq!(count("int8ch"), 1.0, "{metrics}");
    assert_eq!(count("int4"), 0.0, "below the floor, never chosen");
    assert!(metrics.contains("edgeprompt_link_bytes_per_second"));
}
