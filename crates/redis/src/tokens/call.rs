//! The two calls of a reservation: [`Reserve`] and [`Settle`], with their arguments built
//! before the future (so it borrows nothing of the caller's) and their bounds.

use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult};
use tailguard_core::Tenant;
use tailguard_tenant::{Decision, Limit, Ticket, Tokens};

use super::spec::{self, Spec};
use super::{Inner, SETTLE_ATTEMPTS, SETTLE_BACKOFF};

/// A level the scripts returned.
pub(super) fn parse(level: &str) -> RedisResult<u128> {
    level.parse().map_err(|_| {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "a token bucket level that is not an integer",
        ))
    })
}

fn timed_out() -> RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out").into()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A reservation on its way to Redis.
pub(super) struct Reserve {
    tenant: Tenant,
    limits: Arc<[Limit]>,
    specs: Vec<Spec>,
    want: Tokens,
    ticket: Ticket,
    keys: [String; 2],
}

impl Reserve {
    pub(super) fn new(
        inner: &Inner,
        tenant: &Tenant,
        limits: &[Limit],
        want: Tokens,
        ticket: Ticket,
    ) -> Self {
        Reserve {
            tenant: tenant.clone(),
            limits: limits.into(),
            specs: limits.iter().map(Spec::of).collect(),
            want,
            ticket,
            keys: [
                inner.buckets(tenant.id()),
                inner.reservation(tenant.id(), ticket),
            ],
        }
    }

    /// Asks Redis, within the timeout; decides from the levels it returns, or fails open or
    /// closed. A reservation whose answer never came is given back (it may have been taken),
    /// also when this future is dropped while it waits.
    pub(super) async fn run(self, inner: Arc<Inner>) -> Decision {
        let mut call = inner.reserve.prepare_invoke();
        call.key(&self.keys[..]).arg(ms(inner.ttl));
        call.arg(Spec::hash_ttl_ms(&self.specs));
        call.arg(format!("{} {}", self.want.input, self.want.output));
        for (limit, spec) in self.limits.iter().zip(&self.specs) {
            let need = spec.units(limit.kind().of(self.want));
            call.arg(&spec.args()[..]).arg(need.to_string());
        }
        let mut give_back = GiveBack(Some(
            Settle::new(
                &inner,
                &self.tenant,
                &self.limits,
                self.ticket,
                self.want,
                Tokens::ZERO,
            )
            .give_back(),
        ));
        let mut conn = inner.redis.conn();
        let answer = tokio::time::timeout(inner.timeout, call.invoke_async(&mut conn)).await;
        let levels: Vec<String> = match answer {
            Ok(Ok(levels)) => {
                give_back.disarm();
                levels
            }
            Ok(Err(e)) => {
                // Refused, or failed, before the script ran (an answer lost after it ran
                // leaves the reservation to expire as used).
                give_back.disarm();
                return inner
                    .failed(&e, &self.tenant, &self.limits, self.want)
                    .await;
            }
            Err(_) => {
                drop(give_back);
                return inner
                    .failed(&"timed out", &self.tenant, &self.limits, self.want)
                    .await;
            }
        };
        inner.up();
        match self.decide(&levels) {
            Ok(decision) => decision,
            Err(e) => {
                inner
                    .failed(&e, &self.tenant, &self.limits, self.want)
                    .await
            }
        }
    }

    fn decide(&self, answer: &[String]) -> RedisResult<Decision> {
        let (taken, levels) = answer.split_first().ok_or_else(|| {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "an empty reservation answer",
            ))
        })?;
        if taken == "1" {
            return Ok(Decision::Reserved(self.ticket));
        }
        let levels = levels
            .iter()
            .map(|l| parse(l))
            .collect::<RedisResult<Vec<_>>>()?;
        let want = self.want;
        let short = spec::shortfall(&self.limits, &self.specs, &levels, |l| l.kind().of(want));
        short.map(Decision::Refused).ok_or_else(|| {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "a refused reservation that every bucket holds",
            ))
        })
    }
}

/// Gives a reservation back (settles it as unused) when dropped armed.
struct GiveBack(Option<Settle>);

impl GiveBack {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some(settle) = self.0.take() {
            settle.spawn();
        }
    }
}

/// A reconciliation: its script call, ready to send (again).
pub(super) struct Settle {
    inner: Arc<Inner>,
    tenant: Tenant,
    limits: Vec<(Limit, Spec, u64)>,
    keys: [String; 2],
    args: Vec<String>,
    /// `settle`, or `give_back`: a reservation whose answer never came (it may not have
    /// been taken), given back; the label of a lost one.
    what: &'static str,
}

impl Settle {
    pub(super) fn new(
        inner: &Arc<Inner>,
        tenant: &Tenant,
        limits: &[Limit],
        ticket: Ticket,
        reserved: Tokens,
        used: Tokens,
    ) -> Self {
        let specs: Vec<Spec> = limits.iter().map(Spec::of).collect();
        let mut args = vec![Spec::hash_ttl_ms(&specs).to_string()];
        let mut charged = Vec::with_capacity(limits.len());
        for (limit, spec) in limits.iter().zip(specs) {
            let (r, u) = (limit.kind().of(reserved), limit.kind().of(used));
            let (refund, charge) = (r.saturating_sub(u), u.saturating_sub(r));
            args.extend(spec.args());
            args.push(spec.units(refund).to_string());
            args.push(spec.units(charge).to_string());
            charged.push((*limit, spec, charge));
        }
        Settle {
            inner: inner.clone(),
            tenant: tenant.clone(),
            limits: charged,
            keys: [
                inner.buckets(tenant.id()),
                inner.reservation(tenant.id(), ticket),
            ],
            args,
            what: "settle",
        }
    }

    /// A give-back of a reservation whose answer never came.
    fn give_back(mut self) -> Self {
        self.what = "give_back";
        self
    }

    /// One attempt, bounded by the timeout: whether it applied.
    pub(super) async fn once(&self) -> RedisResult<bool> {
        let inner = &self.inner;
        let mut call = inner.reconcile.prepare_invoke();
        call.key(&self.keys[..]).arg(&self.args[..]);
        let mut conn = inner.redis.conn();
        let answer = tokio::time::timeout(inner.timeout, call.invoke_async(&mut conn)).await;
        let Some(levels): Option<Vec<String>> = answer.map_err(|_| timed_out())?? else {
            return Ok(false);
        };
        for ((limit, spec, charge), level) in self.limits.iter().zip(&levels) {
            if *charge == 0 {
                continue;
            }
            let overrun = spec.uncovered(parse(level)?, *charge);
            if overrun > 0 {
                metrics::counter!(
                    "tailguard_tenant_overrun_tokens_total",
                    "tenant" => self.tenant.shared_label(),
                    "window" => limit.window().label(),
                    "kind" => limit.kind().as_str()
                )
                .increment(overrun);
            }
        }
        Ok(true)
    }

    /// Sends it in the background, with bounded retries; without a runtime it is left to
    /// expire.
    pub(super) fn spawn(self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            lost(&self.inner, self.what, &"no tokio runtime to send it on");
            return;
        };
        rt.spawn(async move {
            let inner = self.inner.clone();
            let mut wait = SETTLE_BACKOFF;
            let mut last = None;
            for attempt in 0..SETTLE_ATTEMPTS {
                if attempt > 0 {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                match self.once().await {
                    Ok(_) => {
                        inner.up();
                        return;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if let Some(e) = last {
                lost(&inner, self.what, &e);
            }
        });
    }
}

/// A reconciliation given up (`what`: a settle, or a give-back of a reservation that may not
/// have been taken, as while Redis is down): its reservation, if any, expires as used.
fn lost(inner: &Inner, what: &'static str, e: &dyn std::fmt::Display) {
    tracing::debug!(
        prefix = %inner.prefix,
        "tailguard-redis: a token budget reconciliation was not sent ({e}); \
         its reservation expires as used"
    );
    metrics::counter!("tailguard_tenant_reconciles_lost_total", "what" => what).increment(1);
}
