//! The gRPC `Generate` service: prost messages, the method path, and a small tonic client.
//!
//! The service is `tailguard.mock.v1.Generator`, with one server-streaming method:
//!
//! ```proto
//! syntax = "proto3";
//! package tailguard.mock.v1;
//! service Generator { rpc Generate(GenerateRequest) returns (stream GenerateResponse); }
//! message GenerateRequest  { string prompt = 1; uint32 max_tokens = 2; string model = 3; }
//! message GenerateResponse { string text = 1; uint32 index = 2; optional string finish_reason = 3; }
//! ```
//!
//! The messages are written by hand with `#[derive(prost::Message)]` (no `protoc` needed). The
//! mock server answers the method on the same port as its HTTP routes (gRPC needs HTTP/2: use a
//! client that speaks HTTP/2 with prior knowledge, as tonic's `Channel` does). Each token is one
//! `GenerateResponse`; after the last token comes one message with `finish_reason` set and
//! empty `text`, then trailers `grpc-status: 0`. Script knobs map as: error status → a
//! trailers-only response with the matching `grpc-status` (429 → 8, 503 → 14, 500 → 13);
//! in-band error → trailers `grpc-status: 13`; reset → HTTP/2 stream reset.

use bytes::Bytes;
use http::uri::PathAndQuery;
use http_body::Body;

type StdError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Full path of the `Generate` method.
pub const GENERATE_PATH: &str = "/tailguard.mock.v1.Generator/Generate";

/// A generation request.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct GenerateRequest {
    /// The prompt (the mock only counts its words as prompt tokens).
    #[prost(string, tag = "1")]
    pub prompt: String,
    /// Upper bound on tokens; 0 means "as the script says".
    #[prost(uint32, tag = "2")]
    pub max_tokens: u32,
    /// Model name, echoed nowhere but accepted.
    #[prost(string, tag = "3")]
    pub model: String,
}

/// One streamed message: a token, or the final message with `finish_reason`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct GenerateResponse {
    /// The token's text (empty in the final message).
    #[prost(string, tag = "1")]
    pub text: String,
    /// Token index from 0 (in the final message: the number of tokens).
    #[prost(uint32, tag = "2")]
    pub index: u32,
    /// Set in the final message only: `"stop"` or `"length"`.
    #[prost(string, optional, tag = "3")]
    pub finish_reason: Option<String>,
}

/// A hand-written tonic client for the `Generate` service, usable over a
/// `tonic::transport::Channel` or any `GrpcService` (such as a channel wrapped in tower
/// layers).
///
/// ```no_run
/// # async fn demo(url: String) -> Result<(), Box<dyn std::error::Error>> {
/// use tailguard_mock::grpc::{GenerateClient, GenerateRequest};
/// let channel = tonic::transport::Channel::from_shared(url)?.connect().await?;
/// let mut client = GenerateClient::new(channel);
/// let mut stream = client
///     .generate(GenerateRequest { prompt: "hi".into(), ..Default::default() })
///     .await?
///     .into_inner();
/// while let Some(msg) = stream.message().await? {
///     print!("{}", msg.text);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct GenerateClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T> GenerateClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    /// A client over `inner` (e.g. a `Channel`).
    pub fn new(inner: T) -> Self {
        GenerateClient {
            inner: tonic::client::Grpc::new(inner),
        }
    }

    /// Calls `Generate`: the response streams one [`GenerateResponse`] per token.
    pub async fn generate(
        &mut self,
        request: impl tonic::IntoRequest<GenerateRequest>,
    ) -> Result<tonic::Response<tonic::Streaming<GenerateResponse>>, tonic::Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("service was not ready: {}", e.into())))?;
        let codec = tonic_prost::ProstCodec::<GenerateRequest, GenerateResponse>::default();
        let path = PathAndQuery::from_static(GENERATE_PATH);
        self.inner
            .server_streaming(request.into_request(), path, codec)
            .await
    }
}

/// Decodes the first length-prefixed message of a gRPC request body.
pub(crate) fn decode_request(body: &[u8]) -> Option<GenerateRequest> {
    use prost::Message;
    if body.len() < 5 || body[0] != 0 {
        return None;
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let msg = body.get(5..5usize.checked_add(len)?)?;
    GenerateRequest::decode(msg).ok()
}
