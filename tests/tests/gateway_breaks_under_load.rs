//! Do no harm under breaks: the gateway over two embedded mock replicas at 20 requests/s, one
//! stream in ten broken mid-way (an interruption's bare `[DONE]`, a reset, a stall, half an
//! event). Every request gets an answer in time, and every unbroken one completes, with resume
//! off and on. (The set used to read each break as a single-slot server making room for a newer
//! request, as under load one was always just placed, and held both replicas to one stream at a
//! time: every later request waited.)

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tailguard_gateway::{Args, Config, Gateway};
use tailguard_test_support::client;

const FAULTS: [&str; 4] = [
    "interrupt_after=20",
    "reset_after=20",
    "stall_after=20",
    "half_event=20",
];

async fn run(resume: bool) {
    let mut c = Config::resolve(Default::default(), &Args::default()).unwrap();
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.mock.replicas = 2;
    c.mock.script = "ttft=50ms,tokens=60,gap=20ms".into();
    c.mock.congested_script = c.mock.script.clone();
    c.timeout.idle = Some(Duration::from_secs(2));
    c.hedge.resume = resume;
    let gw = Gateway::start(c).await.unwrap();
    let addr = gw.addr();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300usize {
        tasks.spawn(async move {
            let mut b = Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("content-type", "application/json");
            let fault = (i % 10 == 3).then(|| FAULTS[i / 10 % 4]);
            if let Some(f) = fault {
                b = b.header("x-mock-script-0", f);
            }
            let body =
                r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
            let req = b
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap();
            let answer = tokio::time::timeout(Duration::from_secs(10), async {
                let res = client().request(req).await.unwrap();
                res.into_body().collect().await.map(|b| b.to_bytes())
            })
            .await;
            // Whole: a finish reason, `[DONE]`, no error event. Anything else must say it is
            // not whole (an error event): a stream cut short never ends like a whole one.
            let text = match &answer {
                Ok(Ok(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            let errored = text.contains("\"error\"");
            let completed = text.ends_with("data: [DONE]\n\n")
                && text.contains("\"finish_reason\":\"stop\"")
                && !errored;
            if answer.is_ok() {
                assert!(
                    completed || errored,
                    "request {i} ({fault:?}) cut short silently: {text}"
                );
            }
            (i, fault, answer.is_ok(), completed)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut late = Vec::new();
    let mut unbroken_failed = Vec::new();
    let mut broken_completed = 0;
    while let Some(r) = tasks.join_next().await {
        let (i, fault, answered, completed) = r.unwrap();
        if !answered {
            late.push(i);
        }
        match fault {
            None if !completed => unbroken_failed.push(i),
            Some(_) if completed => broken_completed += 1,
            _ => {}
        }
    }
    assert!(
        late.is_empty(),
        "resume {resume}: no answer in 10 s: {late:?}"
    );
    assert!(
        unbroken_failed.is_empty(),
        "resume {resume}: {unbroken_failed:?}"
    );
    if resume {
        assert_eq!(broken_completed, 30, "every broken stream resumed");
    } else {
        assert_eq!(broken_completed, 0, "every broken stream ended in error");
    }
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn breaks_under_load_hold_up_no_other_request() {
    run(false).await;
    run(true).await;
}
