//! Structured outputs and tool calls through the real `openai` client (checks in
//! `openai_structured.py`) against an edge server with Qwen2.5-Coder-1.5B (its chat template
//! renders tools; the 0.5B model rarely writes calls in that form), behind a real cloud node on loopback gRPC.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::scheduler::SchedulerConfig;

use crate::common;
use common::{load, python, start_cloud};

const QWEN15: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

#[test]
#[ignore = "slow: Qwen2.5-1.5B answers ~40 requests; run with --include-ignored"]
fn structured_outputs_and_tools_with_the_openai_client() {
    let m = load(QWEN15);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = rt.block_on(async {
        let cloud = start_cloud(m.clone()).await;
        let state = EdgeServer::start(
            m.clone(),
            ServerConfig {
                model_id: "qwen15".into(),
                default_max_tokens: 128,
                api_keys: Default::default(),
            },
            SchedulerConfig {
                request_timeout: Duration::from_secs(300),
                ..SchedulerConfig::default()
            },
            common::prefix_config(&cloud),
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, state));
        format!("http://{addr}/v1")
    });
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_structured.py");
    let status = Command::new(python())
        .arg(&script)
        .arg(&base)
        .arg("qwen15")
        .status()
        .unwrap();
    assert!(
        status.success(),
        "structured-output checks failed: {status}"
    );
    drop(rt);
}
