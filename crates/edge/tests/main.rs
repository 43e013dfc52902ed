//! The edge's integration tests, one module per subject, in one binary: each file alone would
//! link its own copy of the server, gRPC and HTTP stacks (21 binaries took 5 minutes of a
//! 2-core build). No test depends on running alone in its process.

mod common;

mod admission;
mod batching;
mod bounded_work;
mod codec_auto;
mod cold;
mod connections;
mod constrained;
mod fairness;
mod fallback;
mod families;
mod faults;
mod first_contact;
mod fused;
mod hostile;
mod http_api;
mod hybrid;
mod lslm;
mod network;
mod page;
mod prefetch;
mod privacy;
mod private_cache;
mod resilience;
mod security;
mod split_auto;
mod store;
mod structured;
mod tenants;
mod window;
