//! Fair queueing across tenants by tokens: order, weights, lift, priorities, the single-tenant
//! FIFO, the correction with the real output, and counters that leak nothing.

mod common;

use std::collections::VecDeque;
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tailguard_admission::{AdmissionBody, BoundedAdmission, BoundedAdmissionLayer, Codel};
use tailguard_core::progress::{Reading, StreamProgress};
use tailguard_core::{Dialect, Priority, RequestFacts, Tenant};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio::time::advance;
use tower::{Layer, Service, ServiceExt};

type Ctl = UnboundedReceiver<(String, Feed)>;
type Res = Response<AdmissionBody<ReadBody>>;
type Call = JoinHandle<Result<Res, std::io::Error>>;

/// The test upstream behind a layer that reads its SSE streams through the request's progress
/// record, as the timeout does inside admission in the usual stack (`read: false`: no layer
/// reads them).
#[derive(Clone)]
struct Reads {
    inner: Upstream,
    read: bool,
}

impl Service<Request<()>> for Reads {
    type Response = Response<ReadBody>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<ReadBody>, std::io::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<()>) -> Self::Future {
        let progress = StreamProgress::of(req.extensions_mut());
        let res = self.inner.call(req).into_inner().map(|res| {
            let sse = Dialect::Auto.resolve_stream(res.headers()).is_some();
            let reading =
                (self.read && sse).then(|| progress.reading(&Dialect::Auto, res.headers()));
            res.map(|inner| ReadBody { inner, reading })
        });
        std::future::ready(res)
    }
}

/// A body read through a progress record.
struct ReadBody {
    inner: ScriptBody,
    reading: Option<Reading>,
}

impl Body for ReadBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(r) = this.reading.as_mut() {
            match &frame {
                Some(Ok(f)) => {
                    if let Some(d) = f.data_ref() {
                        r.observe(d);
                    }
                }
                None => {
                    r.finish();
                }
                Some(Err(_)) => {}
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

fn names(ctl: &mut Ctl) -> Vec<String> {
    arrived(ctl).into_iter().map(|x| x.0).collect()
}

/// A request `id` of `tenant` (none: anonymous) with a counted prompt and `max_tokens`.
fn req(id: &str, tenant: Option<&Tenant>, prompt: u64, max_tokens: Option<u32>) -> Request<()> {
    let mut r = request(id);
    let mut facts = RequestFacts::new().with_prompt_tokens(prompt);
    facts.max_tokens = max_tokens;
    r.extensions_mut().insert(facts);
    if let Some(t) = tenant {
        r.extensions_mut().insert(t.clone());
    }
    r
}

/// The same, answered as an SSE stream (the gate counts its output).
fn sse(id: &str, tenant: Option<&Tenant>, prompt: u64, max_tokens: Option<u32>) -> Request<()> {
    let mut r = req(id, tenant, prompt, max_tokens);
    r.headers_mut()
        .insert("x-sse", http::HeaderValue::from_static("1"));
    r
}

/// A gate of `capacity` with a long queue and deadline, no aging.
fn gate(capacity: u32) -> BoundedAdmissionLayer {
    BoundedAdmissionLayer::new(capacity)
        .with_queue_len(100)
        .with_queue_timeout(Duration::from_secs(600))
        .with_aging(None)
}

/// Sends `tokens` content events, `extra` events and the end on `feed`, and reads `res` to its
/// end.
async fn stream_out(res: Res, feed: Feed, tokens: usize, extra: &[&str]) {
    for _ in 0..tokens {
        feed.send(data(TOKEN)).unwrap();
    }
    for e in extra {
        feed.send(data(e)).unwrap();
    }
    feed.send(data(DONE)).unwrap();
    drop(feed);
    drain(res.into_body()).await.unwrap();
}

/// A gate over the test upstream, with the calls waiting in it.
struct Run {
    svc: BoundedAdmission<Reads>,
    ctl: Ctl,
    calls: Vec<(String, Call)>,
}

impl Run {
    /// A run whose streams are read inside the gate.
    fn new(layer: BoundedAdmissionLayer) -> Self {
        Run::reading(layer, true)
    }

    /// A run whose streams are read inside the gate (`read`) or by no layer.
    fn reading(layer: BoundedAdmissionLayer, read: bool) -> Self {
        let (inner, ctl) = upstream();
        Run {
            svc: layer.layer(Reads { inner, read }),
            ctl,
            calls: Vec::new(),
        }
    }

    /// Sends `r`, which is answered at once (admitted or refused).
    async fn now(&mut self, r: Request<()>) -> Res {
        let res = self.svc.clone().oneshot(r).await.unwrap();
        names(&mut self.ctl);
        res
    }

    /// Sends `r`, which is admitted at once: its answer and the feed of its body.
    async fn fed(&mut self, r: Request<()>) -> (Res, Feed) {
        let res = self.svc.clone().oneshot(r).await.unwrap();
        let mut fed = arrived(&mut self.ctl);
        assert_eq!(fed.len(), 1);
        (res, fed.remove(0).1)
    }

    /// Sends `r`, which waits.
    async fn queue(&mut self, r: Request<()>) {
        let id = r.headers()["x-id"].to_str().unwrap().to_owned();
        self.calls
            .push((id, tokio::spawn(self.svc.clone().oneshot(r))));
        settle().await;
    }

    /// The answer to the waiting call `id`.
    async fn answer(&mut self, id: &str) -> Res {
        let pos = self.calls.iter().position(|(c, _)| c == id).unwrap();
        self.calls.remove(pos).1.await.unwrap().unwrap()
    }

    /// Drops `res` (its permit is released): who was admitted in its place, and its answer.
    async fn release(&mut self, res: Res) -> (String, Res) {
        drop(res);
        settle().await;
        let next = names(&mut self.ctl);
        assert_eq!(next.len(), 1, "one admitted: {next:?}");
        let res = self.answer(&next[0]).await;
        (next[0].clone(), res)
    }

    /// Releases `running`, then each one admitted in its place, `n` times: their names, and
    /// the last one's answer.
    async fn chain(&mut self, mut running: Res, n: usize) -> (Vec<String>, Res) {
        let mut order = Vec::new();
        for _ in 0..n {
            let (id, res) = self.release(running).await;
            running = res;
            order.push(id);
        }
        (order, running)
    }
}

/// Tenant B floods the queue with long prompts; A sends one short request at a time. Each time
/// a permit frees, A's waiting request goes next; without fair queueing it waits behind the
/// whole flood.
#[tokio::test(start_paused = true)]
async fn a_flood_does_not_hold_back_another_tenant() {
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    let flood = |i: usize| req(&format!("b{i}"), Some(&b), 4000, Some(1024));
    let short = |i: usize| req(&format!("a{i}"), Some(&a), 10, Some(16));
    for fair in [true, false] {
        let layer = gate(2).with_tenant_fairness(fair);
        let h = layer.handle();
        let mut run = Run::new(layer);
        let mut running = VecDeque::from([run.now(flood(0)).await, run.now(flood(1)).await]);
        for i in 2..12 {
            run.queue(flood(i)).await;
        }
        if !fair {
            run.queue(short(0)).await;
            let (next, _) = run.release(running.pop_front().unwrap()).await;
            assert_eq!(next, "b2", "FIFO: behind the flood");
            assert_eq!(h.tenants(), 0, "no counters without fair queueing");
            continue;
        }
        for i in 0..3 {
            run.queue(short(i)).await;
            let (next, ai) = run.release(running.pop_front().unwrap()).await;
            assert_eq!(next, format!("a{i}"), "round {i}");
            // A's answer ends; the flood takes the permit back.
            let (next, bi) = run.release(ai).await;
            assert_eq!(next, format!("b{}", i + 2));
            running.push_back(bi);
        }
        assert_eq!(h.queued(), 7);
    }
}

/// Exact VTC accounting with two tenants waiting: B has had two long requests admitted, A
/// arrives with three short ones. A's first is lifted to B's counter and wins the tie (it
/// holds nothing in flight); then B is behind A by A's charge and goes; then A's counter is
/// below B's again by most of a long request, and A's next two go.
#[tokio::test(start_paused = true)]
async fn the_least_served_tenant_goes_next() {
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    let layer = gate(2);
    let h = layer.handle();
    let mut run = Run::new(layer);
    let long = |i: usize| req(&format!("b{i}"), Some(&b), 4000, Some(1024));
    let mut running = VecDeque::from([run.now(long(0)).await, run.now(long(1)).await]);
    for i in 2..6 {
        run.queue(long(i)).await;
    }
    for i in 1..4 {
        run.queue(req(&format!("a{i}"), Some(&a), 10, Some(16)))
            .await;
    }
    // b: two admissions of 4000 + 256 × 2 tokens; a lifted to it.
    assert_eq!(h.tenant_service(Some("b")), Some(9024.0));
    assert_eq!(h.tenant_service(Some("a")), Some(9024.0));
    let mut order = Vec::new();
    for _ in 0..4 {
        let (id, res) = run.release(running.pop_front().unwrap()).await;
        running.push_back(res);
        order.push(id);
    }
    assert_eq!(order, ["a1", "b2", "a2", "a3"]);
    // a: three admissions of 10 + 16 × 2 tokens; b: one more long one.
    assert_eq!(h.tenant_service(Some("a")), Some(9024.0 + 3.0 * 42.0));
    assert_eq!(h.tenant_service(Some("b")), Some(9024.0 + 4512.0));
}

/// A tenant of weight 2 gets twice the service of one of weight 1 while both wait.
#[tokio::test(start_paused = true)]
async fn weights_split_the_service() {
    let (a, b) = (Tenant::new("a").with_weight(2.0), Tenant::new("b"));
    let layer = gate(1);
    let h = layer.handle();
    let mut run = Run::new(layer);
    let x = run
        .now(req("x", Some(&Tenant::new("x")), 100, Some(50)))
        .await;
    for (t, n) in [(&a, "a"), (&b, "b")] {
        for i in 1..=6 {
            run.queue(req(&format!("{n}{i}"), Some(t), 100, Some(50)))
                .await;
        }
    }
    let (order, last) = run.chain(x, 12).await;
    assert_eq!(
        order,
        [
            "a1", "b1", "a2", "a3", "b2", "a4", "a5", "b3", "a6", "b4", "b5", "b6"
        ]
    );
    drop(last);
    assert_eq!((h.tenants(), h.in_flight(), h.queued()), (0, 0, 0));
}

/// A tenant that was idle (nothing waiting) while another was served does not come back with a
/// burst of priority: its counter is lifted to the least among the waiting tenants', so the two
/// alternate instead of the returning tenant taking every release.
#[tokio::test(start_paused = true)]
async fn a_returning_idle_tenant_is_lifted() {
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    let layer = gate(2);
    let h = layer.handle();
    let mut run = Run::new(layer);
    let r = |id: String, t: &Tenant| req(&id, Some(t), 100, Some(50));
    // a's one long request keeps its counter (200) remembered.
    let _a0 = run.now(r("a0".into(), &a)).await;
    let b0 = run.now(r("b0".into(), &b)).await;
    for i in 1..=8 {
        run.queue(r(format!("b{i}"), &b)).await;
    }
    // b is served four times while a waits for nothing.
    let (_, running) = run.chain(b0, 4).await;
    assert_eq!(h.tenant_service(Some("a")), Some(200.0));
    assert_eq!(h.tenant_service(Some("b")), Some(1000.0));
    for i in 1..=3 {
        run.queue(r(format!("a{i}"), &a)).await;
    }
    assert_eq!(h.tenant_service(Some("a")), Some(1000.0), "lifted");
    // Without the lift a1, a2, a3 would take the next three releases. Ties go to the tenant
    // with less in flight (a holds a0): b first, then they alternate.
    let (order, _) = run.chain(running, 4).await;
    assert_eq!(order, ["b5", "a1", "b6", "a2"]);
}

/// Classes come first: an interactive tenant that has received far more service still goes
/// ahead of a batch tenant that has received little.
#[tokio::test(start_paused = true)]
async fn priorities_still_come_first() {
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    let layer = gate(1);
    let h = layer.handle();
    let mut run = Run::new(layer);
    let with = |mut r: Request<()>, p: Priority| {
        r.extensions_mut().insert(p);
        r
    };
    let b0 = run.now(req("b0", Some(&b), 100_000, None)).await;
    for id in ["a1", "a2"] {
        run.queue(with(req(id, Some(&a), 1, Some(1)), Priority::batch()))
            .await;
    }
    for id in ["b1", "b2"] {
        let r = req(id, Some(&b), 100_000, None);
        run.queue(with(r, Priority::interactive())).await;
    }
    assert!(h.tenant_service(Some("b")) > h.tenant_service(Some("a")));
    let (order, _) = run.chain(b0, 4).await;
    assert_eq!(order, ["b1", "b2", "a1", "a2"]);
}

/// Requests without a tenant are one anonymous tenant: they compete with a named tenant as one
/// (FIFO would admit a1 last).
#[tokio::test(start_paused = true)]
async fn requests_without_a_tenant_are_one_tenant() {
    let a = Tenant::new("a");
    let layer = gate(1);
    let h = layer.handle();
    let mut run = Run::new(layer);
    let n0 = run.now(req("n0", None, 1000, None)).await;
    for i in 1..=3 {
        run.queue(req(&format!("n{i}"), None, 1000, None)).await;
    }
    run.queue(req("a1", Some(&a), 1000, None)).await;
    assert_eq!(h.tenants(), 2);
    let (order, _) = run.chain(n0, 4).await;
    assert_eq!(order, ["n1", "a1", "n2", "n3"]);
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Drives one gate through a pseudo-random run of arrivals (three classes, prompts of every
/// size), releases and time: the admissions and refusals, in order.
async fn scripted_run(
    layer: BoundedAdmissionLayer,
    tenant: impl Fn(usize) -> Option<Tenant>,
) -> Vec<String> {
    let mut run = Run::new(layer);
    let mut rng = Lcg(7);
    let mut running: Vec<Res> = Vec::new();
    let mut log = Vec::new();
    let classes = [
        Priority::batch(),
        Priority::standard(),
        Priority::interactive(),
    ];
    for i in 0..120 {
        match rng.next(3) {
            0 | 1 => {
                let max_tokens = rng.next(600) as u32;
                let mut r = req(
                    &format!("r{i}"),
                    tenant(i).as_ref(),
                    rng.next(5000),
                    Some(max_tokens),
                );
                r.extensions_mut()
                    .insert(classes[rng.next(3) as usize].clone());
                let id = r.headers()["x-id"].to_str().unwrap().to_owned();
                run.calls
                    .push((id, tokio::spawn(run.svc.clone().oneshot(r))));
            }
            _ if !running.is_empty() => {
                let k = rng.next(running.len() as u64) as usize;
                drop(running.swap_remove(k));
            }
            _ => {}
        }
        advance(Duration::from_millis(rng.next(300))).await;
        settle().await;
        log.extend(names(&mut run.ctl));
        let finished: Vec<String> = run
            .calls
            .iter()
            .filter(|(_, c)| c.is_finished())
            .map(|(id, _)| id.clone())
            .collect();
        for id in finished {
            let res = run.answer(&id).await;
            if res.status().is_success() {
                running.push(res);
            } else {
                log.push(format!("{id}:{}", res.status().as_u16()));
            }
        }
    }
    log
}

/// With one tenant (named, or requests without one) fair queueing changes nothing: the same run
/// gives the same admissions and refusals, in the same order, as with it off — FIFO within a
/// class, aging, eviction, deadlines, and with CoDel and adaptive LIFO.
#[tokio::test(start_paused = true)]
async fn one_tenant_is_served_exactly_as_without_fair_queueing() {
    fn base() -> BoundedAdmissionLayer {
        BoundedAdmissionLayer::new(3)
            .with_queue_len(12)
            .with_queue_timeout(Duration::from_secs(3))
    }
    fn lifo() -> BoundedAdmissionLayer {
        let codel = Codel {
            interval: Duration::from_millis(400),
            target: Duration::from_millis(800),
        };
        base().with_codel(Some(codel)).with_adaptive_lifo(true)
    }
    for layer in [base as fn() -> BoundedAdmissionLayer, lifo] {
        let off = scripted_run(layer().with_tenant_fairness(false), |_| None).await;
        let named = scripted_run(layer(), |_| Some(Tenant::new("only"))).await;
        let anonymous = scripted_run(layer(), |_| None).await;
        assert!(off.len() > 60, "{off:?}");
        assert!(
            off.iter().any(|x| x.contains(':')),
            "some refusals: {off:?}"
        );
        assert_eq!(named, off);
        assert_eq!(anonymous, off);
        // The run does exercise the order: with two tenants it differs.
        let two = |i: usize| Some(Tenant::new(if i.is_multiple_of(3) { "x" } else { "y" }));
        assert_ne!(scripted_run(layer(), two).await, off);
    }
}

/// The charge at admission counts 256 output tokens; when the body ends it is corrected with
/// the stream's real output, and the order follows: a tenant whose answer was short goes next,
/// one whose answer was long waits.
#[tokio::test(start_paused = true)]
async fn the_real_output_corrects_the_charge_and_the_order() {
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    for (tokens, first, counter) in [(1, "a1", 2.0 + 512.0), (400, "b1", 800.0)] {
        let layer = gate(2);
        let h = layer.handle();
        let mut run = Run::new(layer);
        let (a0, feed) = run.fed(sse("a0", Some(&a), 0, None)).await;
        let _b0 = run.now(sse("b0", Some(&b), 0, None)).await;
        run.queue(sse("a1", Some(&a), 0, None)).await;
        run.queue(sse("b1", Some(&b), 0, None)).await;
        assert_eq!(h.tenant_service(Some("a")), Some(512.0));
        assert_eq!(h.tenant_service(Some("b")), Some(512.0));
        stream_out(a0, feed, tokens, &[]).await;
        settle().await;
        assert_eq!(names(&mut run.ctl), [first], "{tokens} tokens");
        assert_eq!(h.tenant_service(Some("a")), Some(counter));
    }
}

/// The usage the stream reports, when a layer asked for it (the recorder does), is the output;
/// else the token events are (after the first token they are told from syntax alone, so the
/// usage chunk counts as one too: 7 + 1).
#[tokio::test(start_paused = true)]
async fn reported_usage_is_preferred_to_counted_events() {
    let a = Tenant::new("a");
    for (usage, output) in [(false, 8.0), (true, 4.0)] {
        let layer = gate(2);
        let h = layer.handle();
        let mut run = Run::new(layer);
        let mut r = sse("a0", Some(&a), 0, None);
        if usage {
            StreamProgress::of(r.extensions_mut()).want_usage();
        }
        let (a0, feed) = run.fed(r).await;
        // A second request keeps the tenant known after the first ends.
        let _a1 = run.now(req("a1", Some(&a), 0, None)).await;
        stream_out(a0, feed, 7, &[USAGE]).await;
        let counter = 1024.0 + (output - 256.0) * 2.0;
        assert_eq!(h.tenant_service(Some("a")), Some(counter), "usage {usage}");
    }
}

/// Waiters that leave (dropped, evicted, refused, expired) and bodies that end early leave the
/// counters consistent: a body dropped mid-stream is charged the output it sent, and a tenant
/// with nothing left waiting or in flight is forgotten.
#[tokio::test(start_paused = true)]
async fn leaving_waiters_and_dropped_bodies_leak_no_counter() {
    let (a, b, c) = (Tenant::new("a"), Tenant::new("b"), Tenant::new("c"));
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(2)
        .with_queue_timeout(Duration::from_secs(5))
        .with_aging(None);
    let h = layer.handle();
    let mut run = Run::new(layer);
    let (mut a0, feed) = run.fed(sse("a0", Some(&a), 0, None)).await;
    assert_eq!((h.tenants(), h.tenant_service(Some("a"))), (1, Some(512.0)));
    // A waiter whose caller goes away.
    run.queue(sse("b1", Some(&b), 0, None)).await;
    assert_eq!(h.tenants(), 2);
    run.calls.pop().unwrap().1.abort();
    settle().await;
    assert_eq!((h.tenants(), h.queued()), (1, 0));
    // A batch waiter evicted by an interactive arrival when the queue is full.
    let mut batch = sse("b2", Some(&b), 0, None);
    batch.extensions_mut().insert(Priority::batch());
    run.queue(batch).await;
    run.queue(sse("c1", Some(&c), 0, None)).await;
    let mut urgent = sse("c2", Some(&c), 0, None);
    urgent.extensions_mut().insert(Priority::interactive());
    run.queue(urgent).await;
    assert_eq!(run.answer("b2").await.status(), 429);
    assert_eq!((h.tenants(), h.queued()), (2, 2));
    // A refused arrival of a new tenant leaves nothing behind.
    let full = run.now(sse("d1", Some(&Tenant::new("d")), 0, None)).await;
    assert_eq!((full.status().as_u16(), h.tenants()), (429, 2));
    // Waiters that expire.
    advance(Duration::from_secs(6)).await;
    assert_eq!(run.answer("c1").await.status(), 503);
    assert_eq!(run.answer("c2").await.status(), 503);
    assert_eq!((h.tenants(), h.queued()), (1, 0));
    // a0 sends three tokens, then its client goes away while a1 waits: charged three tokens.
    for _ in 0..3 {
        feed.send(data(TOKEN)).unwrap();
        a0.body_mut().frame().await.unwrap().unwrap();
    }
    run.queue(req("a1", Some(&a), 0, None)).await;
    drop(a0);
    settle().await;
    let a1 = run.answer("a1").await;
    let counter = 512.0 + (3.0 - 256.0) * 2.0 + 512.0;
    assert_eq!(h.tenant_service(Some("a")), Some(counter));
    drop(a1);
    assert_eq!((h.tenants(), h.in_flight(), h.queued()), (0, 0, 0));
    drop(feed);
}

/// When no layer reads the stream, the output is unknown: the charge at admission stands (the
/// gate does not scan the stream for it). An error status counts no output.
#[tokio::test(start_paused = true)]
async fn unread_streams_keep_their_charge_and_errors_count_no_output() {
    let a = Tenant::new("a");
    let layer = gate(3);
    let h = layer.handle();
    let mut run = Run::reading(layer, false);
    let _held = run.now(req("a0", Some(&a), 0, None)).await;
    let (a1, feed) = run.fed(sse("a1", Some(&a), 0, None)).await;
    assert_eq!(h.tenant_service(Some("a")), Some(1024.0));
    stream_out(a1, feed, 3, &[]).await;
    assert_eq!(h.tenant_service(Some("a")), Some(1024.0));
    // An inner error (no response): no output, the prompt stays charged.
    let mut failing = req("a2", Some(&a), 10, None);
    failing
        .headers_mut()
        .insert("x-fail", http::HeaderValue::from_static("1"));
    assert!(run.svc.clone().oneshot(failing).await.is_err());
    assert_eq!(h.tenant_service(Some("a")), Some(1024.0 + 10.0));
}
