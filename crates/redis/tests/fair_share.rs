//! Fair-share counters in a real redis-server (scripts/redis.sh starts one and sets
//! TAILGUARD_REDIS_URL; without it these tests fail under CI, and say so and skip elsewhere).

mod common;

use std::time::Duration;

use common::{free_port, pool, redis_url};
use tailguard_admission::{FairShareBackend, ServiceReport, tenant_key};
use tailguard_redis::{Redis, RedisFairShare};

const TIMEOUT: Duration = Duration::from_secs(2);

fn gateway(url: &str, name: &str) -> RedisFairShare {
    let redis = Redis::new(url, TIMEOUT).expect("redis url");
    RedisFairShare::new(redis, "tailguard-test", name)
}

fn report(served: &[(&str, f64)], wanted: &[&str]) -> ServiceReport {
    ServiceReport {
        served: served
            .iter()
            .map(|(t, s)| (tenant_key(Some(t)), *s))
            .collect(),
        wanted: wanted.iter().map(|t| tenant_key(Some(t))).collect(),
    }
}

/// Two gateways add to the same totals and read each other's service, fractions and negative
/// corrections included; an unknown tenant reads 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_add_to_one_set_of_totals() {
    let Some(url) = redis_url("two_gateways_add_to_one_set_of_totals") else {
        return;
    };
    let name = pool("fair");
    let (a, b) = (gateway(&url, &name), gateway(&url, &name));
    let got = a
        .exchange(report(&[("x", 10.25)], &["x", "y"]))
        .await
        .unwrap();
    assert_eq!(got, [10.25, 0.0]);
    let got = b
        .exchange(report(&[("x", 5.5), ("y", -1.0)], &["x"]))
        .await
        .unwrap();
    assert_eq!(got, [15.75]);
    let got = a.exchange(report(&[], &["x", "y"])).await.unwrap();
    assert_eq!(got, [15.75, -1.0]);
    // Another cluster name is another set of totals.
    let other = gateway(&url, &pool("fair"));
    assert_eq!(other.exchange(report(&[], &["x"])).await.unwrap(), [0.0]);
}

/// An unreachable Redis is an error within the timeout, not a hang.
#[tokio::test]
async fn an_unreachable_redis_is_an_error() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let redis = Redis::new(&url, Duration::from_millis(200)).expect("redis url");
    let fair = RedisFairShare::new(redis, "tailguard-test", "down");
    let call = fair.exchange(report(&[("x", 1.0)], &["x"]));
    let res = tokio::time::timeout(Duration::from_secs(5), call).await;
    assert!(res.expect("bounded").is_err());
}
