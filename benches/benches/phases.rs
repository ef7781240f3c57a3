//! `LatencyPhaseRecorder` vs tower-http's `TraceLayer` (default callbacks) on the same
//! in-memory SSE stream: per-request cost (a 2-frame response) and per-frame cost (a 256-frame
//! response, reported per frame). No tracing subscriber and no metrics recorder are installed,
//! so both layers pay only their own bookkeeping; the recorder still scans every frame.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body::{Body, Frame};
use tailguard::phases::LatencyPhaseRecorderLayer;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_http::trace::TraceLayer;

const ROLE: &[u8] = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n";
const TOKEN: &[u8] = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n";
const DONE: &[u8] = b"data: [DONE]\n\n";

/// A body that yields pre-built frames without waiting.
struct Frames {
    frames: std::vec::IntoIter<Bytes>,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.frames.next().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.len() == 0
    }
}

fn stream(tokens: usize) -> Vec<Bytes> {
    let mut v = Vec::with_capacity(tokens + 2);
    v.push(Bytes::from_static(ROLE));
    v.extend(std::iter::repeat_n(Bytes::from_static(TOKEN), tokens));
    v.push(Bytes::from_static(DONE));
    v
}

/// Answers at once with `frames`, each time in the next of their
/// [`variants`](tailguard_benches::variants) (same bytes but the chat id, so core's memo of
/// pre-token decisions never hits across requests).
fn upstream(
    frames: Vec<Bytes>,
) -> impl Service<Request<String>, Response = Response<Frames>, Error = Infallible, Future: Send> + Clone
{
    let versions = tailguard_benches::variants(&frames);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    service_fn(move |_req: Request<String>| {
        let k =
            next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % tailguard_benches::VARIANTS;
        let frames = versions[k].to_vec();
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Frames {
                        frames: frames.into_iter(),
                    })
                    .unwrap(),
            )
        }
    })
}

async fn drain<B: Body>(body: B) -> usize {
    let mut body = std::pin::pin!(body);
    let mut n = 0;
    while let Some(f) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if f.is_ok() {
            n += 1;
        }
    }
    n
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();

    for (group, tokens) in [("phases/request", 0usize), ("phases/frame", 256)] {
        let frames = stream(tokens);
        let n = frames.len() as u64;
        let mut g = c.benchmark_group(group);
        if tokens > 0 {
            g.throughput(Throughput::Elements(n));
        }

        let bare = upstream(frames.clone());
        g.bench_function("bare", |b| {
            b.iter_batched(
                || bare.clone(),
                |svc| {
                    rt.block_on(async {
                        let res = svc.oneshot(Request::new(String::new())).await.unwrap();
                        drain(res.into_body()).await
                    })
                },
                BatchSize::SmallInput,
            )
        });

        let trace = TraceLayer::new_for_http().layer(upstream(frames.clone()));
        g.bench_function("tower_http_trace", |b| {
            b.iter_batched(
                || trace.clone(),
                |svc| {
                    rt.block_on(async {
                        let res = svc.oneshot(Request::new(String::new())).await.unwrap();
                        drain(res.into_body()).await
                    })
                },
                BatchSize::SmallInput,
            )
        });

        let recorder = LatencyPhaseRecorderLayer::new()
            .with_routes(["/v1/chat/completions"])
            .with_models(["gpt-4o"])
            .layer(upstream(frames.clone()));
        g.bench_function("latency_phase_recorder", |b| {
            b.iter_batched(
                || recorder.clone(),
                |svc| {
                    rt.block_on(async {
                        let res = svc.oneshot(Request::new(String::new())).await.unwrap();
                        drain(res.into_body()).await
                    })
                },
                BatchSize::SmallInput,
            )
        });

        let recorder_no_usage = LatencyPhaseRecorderLayer::new()
            .with_usage(false)
            .layer(upstream(frames.clone()));
        g.bench_function("latency_phase_recorder_no_usage", |b| {
            b.iter_batched(
                || recorder_no_usage.clone(),
                |svc| {
                    rt.block_on(async {
                        let res = svc.oneshot(Request::new(String::new())).await.unwrap();
                        drain(res.into_body()).await
                    })
                },
                BatchSize::SmallInput,
            )
        });
        // The recorder's own machinery, with scanning reduced to nothing: under `AnyByte` every
        // non-empty frame is one token, found without looking at its bytes.
        let recorder_any_byte = LatencyPhaseRecorderLayer::new()
            .with_dialect(tailguard_core::Dialect::AnyByte)
            .layer(upstream(frames.clone()));
        g.bench_function("latency_phase_recorder_any_byte", |b| {
            b.iter_batched(
                || recorder_any_byte.clone(),
                |svc| {
                    rt.block_on(async {
                        let res = svc.oneshot(Request::new(String::new())).await.unwrap();
                        drain(res.into_body()).await
                    })
                },
                BatchSize::SmallInput,
            )
        });

        if tokens > 0 {
            // The share of the recorder's per-frame cost that is core's token tracking.
            let headers = {
                let mut h = http::HeaderMap::new();
                h.insert("content-type", "text/event-stream".parse().unwrap());
                h
            };
            for usage in [true, false] {
                let name = if usage {
                    "tracker_only"
                } else {
                    "tracker_only_no_usage"
                };
                g.bench_function(name, |b| {
                    b.iter(|| {
                        let mut t = tailguard_core::StreamTracker::new(
                            &tailguard_core::Dialect::Auto,
                            &headers,
                        )
                        .with_usage(usage);
                        let mut tokens = 0;
                        for f in &frames {
                            tokens += t.observe(f).tokens;
                        }
                        tokens
                    })
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
