//! Shared code of the tailguard example programs.
//!
//! The [`gateway`] module is the OpenAI-compatible gateway that `cargo run --release --example
//! gateway` starts; it lives in this library so that tests can start it in-process. Its
//! [`build_stack`](gateway::build_stack) is the recommended tailguard stack in one
//! `ServiceBuilder`, over any set of replicas:
//!
//! ```
//! use http::Request;
//! use axum::body::Body;
//! use http_body_util::BodyExt;
//! use hyper_util::rt::TokioExecutor;
//! use tailguard_examples::gateway::{Args, Config, HttpClient, Replica, build_stack};
//! use tailguard_mock::{MockServer, Script};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let mock = MockServer::start(Script::new().tokens(3)).await?;
//! let config = Config::resolve(Default::default(), &Args::default())?;
//! let client: HttpClient =
//!     hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
//! let replicas = vec![Replica::new(client, &mock.url().parse()?, "replica-0")?];
//! let (_drain, drain_signal) = tokio::sync::watch::channel(false);
//! let stack = build_stack(&config, replicas, drain_signal);
//!
//! let body = r#"{"model":"mock-llm","stream":true,"messages":[]}"#;
//! let req = Request::post("/v1/chat/completions").body(Body::from(body))?;
//! let res = stack.oneshot(req).await?;
//! assert!(res.headers().contains_key("x-request-id"));
//! let text = res.into_body().collect().await?.to_bytes();
//! assert!(text.ends_with(b"data: [DONE]\n\n"));
//! # mock.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod gateway;
