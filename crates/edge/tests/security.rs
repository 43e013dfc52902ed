//! Edge to cloud over TLS with a bearer token, on real loopback sockets: the right CA and token
//! fetch KV; no token, a wrong token, an untrusted certificate or plaintext are refused.

use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, CloudService, Limits, PromptSpec};
use edgeprompt_edge::{ClientSecurity, CloudClient};
use edgeprompt_kv::Codec;
use edgeprompt_protocol::PromptRef;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::common;
use common::{model, pki, SUPPORT};

async fn fetch(url: &str, sec: &ClientSecurity) -> Result<usize, String> {
    let m = model();
    let mut c = CloudClient::connect_with(url, sec)
        .await
        .map_err(|e| e.to_string())?;
    let (h, mut rx) = c
        .fetch(&m, PromptRef::Id("support".into()), &[Codec::F16], false)
        .await
        .map_err(|e| e.to_string())?;
    let mut layers = 0;
    while let Some(a) = rx.recv().await {
        a.map_err(|e| e.to_string())?;
        layers += 1;
    }
    assert_eq!(h.n_layers, layers);
    Ok(layers)
}

#[test]
fn tls_and_token_are_required_and_verified() {
    let m = model();
    let (ca, cert, key) = pki();
    let (other_ca, _, _) = pki();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let specs = vec![PromptSpec {
            id: "support".into(),
            system: SUPPORT.into(),
            text: None,
        }];
        let node = CloudNode::new(m.clone(), &specs, 64 << 20)
            .unwrap()
            .with_guard(Limits::default(), Some("s3cret-token".into()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            Server::builder()
                .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(&cert, &key)))
                .unwrap()
                .add_service(CloudService::server(Arc::new(node)))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        let https = format!("https://127.0.0.1:{port}");
        let sec = |ca: &str, token: Option<&str>| ClientSecurity {
            ca_pem: Some(ca.as_bytes().to_vec()),
            domain: Some("localhost".into()),
            token: token.map(String::from),
        };

        // The right CA and token: the TLS handshake verifies "localhost" and KV flows.
        let layers = fetch(&https, &sec(&ca, Some("s3cret-token")))
            .await
            .unwrap();
        assert_eq!(layers, m.cfg.n_layer);

        let err = fetch(&https, &sec(&ca, None)).await.unwrap_err();
        assert!(err.contains("Unauthenticated"), "{err}");
        let err = fetch(&https, &sec(&ca, Some("guess"))).await.unwrap_err();
        assert!(err.contains("Unauthenticated"), "{err}");
        // A certificate this edge does not trust, or the wrong name, never gets a request out.
        assert!(fetch(&https, &sec(&other_ca, Some("s3cret-token")))
            .await
            .is_err());
        let wrong_name = ClientSecurity {
            domain: Some("cloud.example".into()),
            ..sec(&ca, Some("s3cret-token"))
        };
        assert!(fetch(&https, &wrong_name).await.is_err());
        // Plaintext to the TLS port fails.
        let plain = ClientSecurity {
            token: Some("s3cret-token".into()),
            ..ClientSecurity::default()
        };
        assert!(fetch(&format!("http://127.0.0.1:{port}"), &plain)
            .await
            .is_err());
        // The node still serves after all of that.
        assert_eq!(
            fetch(&https, &sec(&ca, Some("s3cret-token")))
                .await
                .unwrap(),
            m.cfg.n_layer
        );
    });
}
