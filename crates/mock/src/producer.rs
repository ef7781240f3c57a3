//! The producer of one streamed response: a task that acts out the script's timeline and
//! hands the body its events.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep, sleep_until};

use crate::body::{Item, MockBody};
use crate::faults::filler;
use crate::rng::SplitMix64;
use crate::script::{Cut, Reset, Script};
use crate::server::Inner;
use crate::slots::Slot;
use crate::stats::{InFlight, Outcome, Recorder, RequestGuard};
use crate::wire::{self, Api, Ctx};

/// What one streamed response is made of.
pub(crate) struct Job {
    pub(crate) ctx: Ctx,
    pub(crate) script: Script,
    pub(crate) tokens: u32,
    pub(crate) ttft: Duration,
    pub(crate) rng: SplitMix64,
}

/// Starts the producer of one streamed response. Returns its body and a signal that the
/// response head may be sent (at once, or when the slot is taken with
/// [`head_after_slot`](crate::ReplicaOptions::head_after_slot)). `abort` is the connection's
/// RST flag (HTTP/1.1 only).
pub(crate) fn spawn(
    replica: Arc<Inner>,
    job: Job,
    guard: RequestGuard,
    abort: Option<Arc<AtomicBool>>,
) -> (MockBody, oneshot::Receiver<()>) {
    let (tx, rx) = mpsc::channel(1);
    let (head_tx, head_rx) = oneshot::channel();
    let (late_tx, late_rx) = match replica.options.prefill_cancelled {
        true => {
            let (a, b) = oneshot::channel();
            (Some(a), Some(b))
        }
        false => (None, None),
    };
    let abort = abort.filter(|_| job.script.rst);
    let producer = Producer {
        tx,
        slot: replica.takes_slot(&job.script),
        job,
        recorder: guard.recorder(),
        index: guard.index(),
        replica,
        head: Some(head_tx),
        late: late_rx,
        keepalive: None,
        next_keepalive: Instant::now(),
        streaming: false,
    };
    let task = tokio::spawn(producer.run()).abort_handle();
    (MockBody::stream(rx, task, guard, abort, late_tx), head_rx)
}

struct Producer {
    tx: mpsc::Sender<Item>,
    job: Job,
    recorder: Recorder,
    index: u64,
    replica: Arc<Inner>,
    /// Takes one of the replica's slots.
    slot: bool,
    /// Released when the response head may be sent.
    head: Option<oneshot::Sender<()>>,
    /// With `prefill_cancelled`: the in-flight count of a body dropped before the first token.
    late: Option<oneshot::Receiver<InFlight>>,
    keepalive: Option<(Duration, Bytes)>,
    next_keepalive: Instant,
    /// The first token was sent.
    streaming: bool,
}

/// The body is gone: stop producing.
struct Gone;

impl Producer {
    async fn run(mut self) {
        // Every exit is either an end item or the body being gone.
        let _ = self.run_inner().await;
    }

    async fn run_inner(&mut self) -> Result<(), Gone> {
        let _permit = self.prelude().await?;
        let n = self.job.tokens;
        for i in 0..=n {
            if i > 0 && i < n {
                let gap = self
                    .replica
                    .decode_gap(self.job.script.gap.sample(&mut self.job.rng));
                self.wait(gap).await?;
            }
            if let Some((k, pause)) = self.job.script.stall_after
                && k == i
            {
                match pause {
                    Some(p) => self.wait(p).await?,
                    None => self.during(std::future::pending::<()>()).await?,
                }
            }
            if self.ended_at(i).await? {
                return Ok(());
            }
            if i < n {
                // Junk before the first token; junk after it where the second would go (after
                // its gap, so the first token is a frame of its own).
                match i {
                    0 => self.junk(self.job.script.junk_before).await?,
                    1 => self.junk(self.job.script.junk_after).await?,
                    _ => {}
                }
                self.token(i).await?;
            }
        }
        if n == 1 {
            self.junk(self.job.script.junk_after).await?;
        }
        self.epilogue().await
    }

    /// The head, the meta events, the slot and the TTFT; returns the slot.
    async fn prelude(&mut self) -> Result<Option<Slot>, Gone> {
        let slot = self.replica.slot.clone();
        let mut permit = None;
        if self.slot && self.replica.options.head_after_slot {
            // No bytes before the head, so no keepalives while waiting for it.
            permit = slot.clone().acquire().await;
        }
        if let Some(head) = self.head.take() {
            let _ = head.send(());
        }
        if let (Some(every), Some(frame)) = (self.job.script.keepalive_every, self.job.ctx.keepalive())
            // A period so long it overflows the clock means "never".
            && let Some(first) = Instant::now().checked_add(every)
        {
            self.keepalive = Some((every, frame));
            self.next_keepalive = first;
        }
        if self.job.script.early_meta {
            self.preamble().await?;
        }
        if self.slot && permit.is_none() {
            permit = self.during(slot.acquire()).await?;
        }
        self.wait(self.job.ttft).await?;
        if !self.job.script.early_meta {
            self.preamble().await?;
        }
        Ok(permit)
    }

    async fn preamble(&mut self) -> Result<(), Gone> {
        for b in self.job.ctx.preamble() {
            self.send(Item::Data(b)).await?;
        }
        Ok(())
    }

    /// Ends the stream after `i` tokens if something scripted (or a newer request) says so.
    /// An interrupt (scripted, or by a newer request) comes first.
    async fn ended_at(&mut self, i: u32) -> Result<bool, Gone> {
        let script = &self.job.script;
        let reset = script.reset == Reset::AfterTokens(i);
        let end = if self.interrupted() || script.interrupt_after == Some(i) {
            if let Some(b) = self.job.ctx.terminal(i) {
                self.send(Item::Data(b)).await?;
            }
            Item::Break(Outcome::Interrupted(i))
        } else if let Some((k, cut)) = script.cut
            && k == i
        {
            self.cut(i, cut).await?;
            match reset {
                true => Item::Break(Outcome::ResetAfterTokens(i)),
                false => Item::End(Outcome::Truncated(i)),
            }
        } else if reset {
            Item::Break(Outcome::ResetAfterTokens(i))
        } else if script.error_event_after == Some(i) {
            match self.job.ctx.error_event() {
                Some(b) => Item::Last(b, Outcome::ErrorEvent(i)),
                None => Item::Trailers(wire::grpc_error_trailers(), Outcome::ErrorEvent(i)),
            }
        } else {
            return Ok(false);
        };
        self.send(end).await?;
        Ok(true)
    }

    /// A newer request arrived on a replica that interrupts running streams.
    fn interrupted(&self) -> bool {
        self.replica.options.interrupt && self.replica.latest.load(Ordering::Relaxed) > self.index
    }

    /// Half an event, or an endless line.
    async fn cut(&mut self, i: u32, cut: Cut) -> Result<(), Gone> {
        match cut {
            Cut::HalfEvent => {
                let half = self.job.ctx.half_event(i, self.job.tokens);
                self.send(Item::Data(half)).await
            }
            Cut::EndlessLine => {
                self.send(Item::Data(self.job.ctx.line_start())).await?;
                let mut left = self.job.script.line_bytes;
                while left > 0 {
                    let b = filler(left);
                    left -= b.len() as u64;
                    self.send(Item::Data(b)).await?;
                }
                Ok(())
            }
        }
    }

    async fn token(&mut self, i: u32) -> Result<(), Gone> {
        if !self.streaming && self.late.is_some() && self.tx.is_closed() {
            // The client went away while queued or during the prefill: noticed only now.
            self.recorder.served_late();
            return Err(Gone);
        }
        let b = match self.job.script.garbage {
            Some(kind) => self.job.ctx.garbage(kind, i),
            None => {
                self.recorder.token();
                self.job.ctx.token(i)
            }
        };
        self.send(Item::Data(b)).await?;
        self.streaming = true;
        Ok(())
    }

    /// `n` junk data lines.
    async fn junk(&mut self, n: u32) -> Result<(), Gone> {
        for k in 0..n {
            if let Some(b) = self.job.ctx.junk(k) {
                self.send(Item::Data(b)).await?;
            }
        }
        Ok(())
    }

    async fn epilogue(&mut self) -> Result<(), Gone> {
        let n = self.job.tokens;
        let grpc = self.job.ctx.api == Api::Grpc;
        let mut events = self.job.ctx.epilogue(n);
        let terminal = if grpc { None } else { events.pop() };
        for b in events {
            self.send(Item::Data(b)).await?;
        }
        let last = match (self.job.script.no_done, terminal) {
            (true, _) => Item::End(Outcome::Truncated(n)),
            (false, _) if grpc => Item::Trailers(wire::grpc_ok_trailers(), Outcome::Completed),
            (false, Some(b)) => Item::Last(b, Outcome::Completed),
            (false, None) => Item::End(Outcome::Completed),
        };
        self.send(last).await
    }

    async fn send(&mut self, item: Item) -> Result<(), Gone> {
        match self.tx.send(item).await {
            Ok(()) => Ok(()),
            // Before its first token a replica that prefills cancelled requests does not notice.
            Err(_) if self.late.is_some() && !self.streaming => Ok(()),
            Err(_) => Err(Gone),
        }
    }

    /// Waits for `fut`, sending keepalives on schedule meanwhile; stops when the body is gone
    /// (before the first token only if cancelled requests are not prefilled).
    async fn during<F: Future>(&mut self, fut: F) -> Result<F::Output, Gone> {
        let mut fut = std::pin::pin!(fut);
        loop {
            let notice = self.streaming || self.late.is_none();
            let keepalive = self.keepalive.clone();
            let (every, frame) = tokio::select! {
                biased;
                out = &mut fut => return Ok(out),
                () = self.tx.closed(), if notice => return Err(Gone),
                () = sleep_until(self.next_keepalive), if keepalive.is_some() => match keepalive {
                    Some(k) => k,
                    None => continue,
                },
            };
            match self.next_keepalive.checked_add(every) {
                Some(next) => self.next_keepalive = next,
                // Beyond the end of time: no more keepalives.
                None => self.keepalive = None,
            }
            self.send(Item::Data(frame)).await?;
        }
    }

    async fn wait(&mut self, d: Duration) -> Result<(), Gone> {
        if d.is_zero() {
            return Ok(());
        }
        self.during(sleep(d)).await
    }
}
