//! A hedge budget shared by several gateways: local buckets reconciled with one shared bucket.
//!
//! The hedge decides on the first-token timer, inside `poll`; it must never wait on the
//! network. So each layer keeps a local *allowance* of tokens taken from the shared bucket,
//! and decides from it at once. A background task, every [period](SharedBudget::with_period),
//! makes one exchange with the [`BudgetBackend`]: it reports the deposits made since the last
//! exchange (the budget's ratio of every eligible request) and takes tokens to cover about
//! twice the extra attempts asked for in the last period. The shared bucket applies the floor
//! rate and the max balance, once for the whole cluster, so across all gateways the extra
//! attempts stay within `ratio × requests + floor × seconds + max_balance` — tokens only ever
//! come out of the shared bucket. Deposits reach it up to one period late, which can only delay
//! a hedge, never license one more.
//!
//! While the backend fails (each exchange is bounded by its timeout), the layer decides from
//! its own local bucket, configured by the same [`HedgeBudget`](crate::HedgeBudget) (fail open,
//! the default), or sends no extra attempt (fail closed); a warning is logged when the backend
//! goes down and `tailguard_hedge_budget_backend_errors_total` counts failed exchanges.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tailguard_core::BoxError;

/// One exchange with the shared bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exchange {
    /// Tokens deposited since the last exchange.
    pub deposited: f64,
    /// Tokens wanted for the next period.
    pub want: f64,
    /// The floor rate, in tokens per second, for the shared bucket to apply.
    pub floor_per_sec: f64,
    /// The largest balance of the shared bucket (and its initial balance).
    pub max_balance: f64,
}

/// The future of [`BudgetBackend::exchange`]: the tokens granted.
pub type ExchangeFuture = Pin<Box<dyn Future<Output = Result<f64, BoxError>> + Send>>;

/// A token bucket shared by several gateways.
pub trait BudgetBackend: fmt::Debug + Send + Sync + 'static {
    /// Atomically adds the deposits and the floor earned since the last exchange (capped at the
    /// max balance), then takes up to `want` whole tokens: returns the tokens taken.
    fn exchange(&self, ex: Exchange) -> ExchangeFuture;
}

/// Sharing of a [`HedgeBudget`](crate::HedgeBudget) through a [`BudgetBackend`]
/// ([`HedgeBudget::with_shared`](crate::HedgeBudget::with_shared)).
#[derive(Clone, Debug)]
pub struct SharedBudget {
    backend: Arc<dyn BudgetBackend>,
    period: Duration,
    timeout: Duration,
    fail_open: bool,
}

impl PartialEq for SharedBudget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.backend, &other.backend)
            && (self.period, self.timeout, self.fail_open)
                == (other.period, other.timeout, other.fail_open)
    }
}

impl SharedBudget {
    /// Shares the budget through `backend`. Defaults: one exchange every 100 ms, each bounded
    /// by 50 ms, fail open (the local bucket decides while the backend fails).
    pub fn new(backend: Arc<dyn BudgetBackend>) -> Self {
        SharedBudget {
            backend,
            period: Duration::from_millis(100),
            timeout: Duration::from_millis(50),
            fail_open: true,
        }
    }

    /// Sets the exchange period (at least 10 ms).
    pub fn with_period(mut self, period: Duration) -> Self {
        self.period = period.max(Duration::from_millis(10));
        self
    }

    /// Sets the timeout of one exchange (at least 1 ms).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Fail open (`true`, the default: the local bucket decides while the backend fails) or
    /// closed (no extra attempt while it fails).
    pub fn with_fail_open(mut self, open: bool) -> Self {
        self.fail_open = open;
        self
    }
}

/// The local side of a shared budget.
#[derive(Debug)]
pub(crate) struct Reconciled {
    cfg: SharedBudget,
    floor_per_sec: f64,
    max_balance: f64,
    state: Mutex<Local>,
}

#[derive(Debug, Default)]
struct Local {
    /// Tokens taken from the shared bucket, not yet spent.
    allowance: f64,
    /// Deposits not yet reported.
    pending: f64,
    /// Extra attempts asked for since the last exchange.
    asked: u32,
    /// Whether the last exchange failed.
    down: bool,
    /// Whether the exchange task runs.
    started: bool,
}

impl Reconciled {
    pub(crate) fn new(cfg: SharedBudget, floor_per_sec: f64, max_balance: f64) -> Arc<Self> {
        Arc::new(Reconciled {
            cfg,
            floor_per_sec,
            max_balance,
            state: Mutex::new(Local::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, Local> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a deposit of `tokens`; starts the exchange task on the first one.
    pub(crate) fn deposit(self: &Arc<Self>, tokens: f64) {
        let start = {
            let mut st = self.state();
            st.pending += tokens;
            !std::mem::replace(&mut st.started, true)
        };
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(reconcile(Arc::downgrade(self)))),
                Err(_) => self.state().started = false,
            }
        }
    }

    /// Decides on an extra attempt from the allowance: `Some(granted)`, or `None` when the
    /// backend is down and the budget fails open (the local bucket decides).
    pub(crate) fn withdraw(&self) -> Option<bool> {
        let mut st = self.state();
        st.asked = st.asked.saturating_add(1);
        if st.down {
            return (!self.cfg.fail_open).then_some(false);
        }
        if st.allowance < 1.0 {
            return Some(false);
        }
        st.allowance -= 1.0;
        Some(true)
    }

    /// One exchange: reports the pending deposits, takes the tokens for the next period.
    async fn exchange(&self) {
        let ex = {
            let mut st = self.state();
            let want = (2.0 * f64::from(st.asked)).clamp(1.0, self.max_balance) - st.allowance;
            st.asked = 0;
            Exchange {
                deposited: std::mem::take(&mut st.pending),
                want: want.max(0.0).floor(),
                floor_per_sec: self.floor_per_sec,
                max_balance: self.max_balance,
            }
        };
        let call = self.cfg.backend.exchange(ex);
        let res = match tokio::time::timeout(self.cfg.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err("timed out".into()),
        };
        let mut st = self.state();
        match res {
            Ok(granted) => {
                if std::mem::replace(&mut st.down, false) {
                    tracing::info!("tailguard-hedge: shared budget backend back");
                }
                st.allowance += granted.max(0.0);
            }
            Err(e) => {
                // The deposits are not reported again: a timed-out exchange may have been
                // applied, and counting them twice would loosen the bound (losing them
                // tightens it).
                if !std::mem::replace(&mut st.down, true) {
                    tracing::warn!(
                        "tailguard-hedge: shared budget backend unreachable ({e}); failing {}",
                        if self.cfg.fail_open { "open" } else { "closed" }
                    );
                }
                metrics::counter!("tailguard_hedge_budget_backend_errors_total").increment(1);
            }
        }
    }
}

/// Exchanges every period while the layer lives.
async fn reconcile(shared: Weak<Reconciled>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        s.exchange().await;
        let period = s.cfg.period;
        drop(s);
        tokio::time::sleep(period).await;
    }
}
