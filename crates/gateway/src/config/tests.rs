//! The resolution of flags, file and defaults, and the README's table checked against
//! [`Args`].

use std::time::Duration;

use clap::Parser;

use super::*;

#[test]
fn values_parse() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("5 parsecs").is_err());
    assert_eq!(parse_duration("5 s"), Ok(Duration::from_secs(5)));
    assert_eq!("off".parse(), Ok(Timer(None)));
    assert!("yes".parse::<OnOff>().is_err());
}

#[test]
fn defaults_are_the_layers_own() {
    let c = Config::default();
    assert_eq!(c.max_request_bytes, tailguard::core::DEFAULT_REPLAY_CAP);
    let min = tailguard::admission::adaptive::DEFAULT_MIN_LIMIT;
    assert_eq!(c.admission.min_limit, min);
    assert_eq!(c.cluster.lease_ttl, tailguard::admission::DEFAULT_LEASE_TTL);
    let header = c.priority.header.as_ref().map(|h| h.as_str());
    assert_eq!(header, Some(tailguard::priority::DEFAULT_HEADER));
    let header = c.timeout.deadline_header;
    assert_eq!(header, Some(tailguard::core::deadline::REQUEST_TIMEOUT));
    assert_eq!(c.hedge.routing, crate::Routing::LeastWait);
    assert_eq!(
        (c.hedge.outlier_ejection, c.timeout.propagate_deadline),
        (true, false)
    );
    assert_eq!((c.timeout.liveness, c.cluster.redis), (None, None));
    assert!(c.timeout.require_finish);
    assert_eq!(c.models, [MOCK_MODEL]);
}

#[test]
fn the_finish_check_can_be_switched_off() {
    let text = "[timeout]\nrequire_finish = false\n";
    let c = Config::resolve(
        Config::parse_file(text).unwrap(),
        &Args::parse_from(["gateway"]),
    );
    assert!(!c.unwrap().timeout.require_finish);
    let args = Args::parse_from(["gateway", "--require-finish", "off"]);
    let c = Config::resolve(FileConfig::default(), &args).unwrap();
    assert!(!c.timeout.require_finish);
}

#[test]
fn errors_name_the_dotted_key() {
    let text = "listen = \"127.0.0.1:1\"\n[timeout]\nhead = \"1s\"\nidle = \"5 parsecs\"\n";
    let e = Config::parse_file(text).unwrap_err().to_string();
    assert!(e.contains("key `timeout.idle`"), "{e}");
    let e = Config::parse_file("[hedge]\nmax_attempt = 2\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("key `hedge.max_attempt`"), "{e}");
    let e = Config::parse_file("listen = 8080\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("key `listen`"), "{e}");
    let e = Config::parse_file("config = \"x.toml\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `config`"), "{e}");
}

#[test]
fn adaptive_admission_is_off_by_default_and_set_by_file_or_flag() {
    let resolve = |text: &str, args: &Args| Config::resolve(Config::parse_file(text)?, args);
    assert!(!resolve("", &Args::default()).unwrap().admission.adaptive);
    let text = "[admission]\nadaptive = true\nmin_limit = 2\n";
    let c = resolve(text, &Args::default()).unwrap();
    assert_eq!((c.admission.adaptive, c.admission.min_limit), (true, 2));
    let mut args = Args::default();
    args.admission.adaptive = Some(false);
    assert!(!resolve(text, &args).unwrap().admission.adaptive);
    let e = resolve("[admission]\nmin_limit = 0\n", &Args::default()).unwrap_err();
    assert!(e.to_string().contains("admission.min_limit"), "{e}");
}

#[test]
fn cluster_keys_from_the_file_and_flags() {
    let text = "[cluster]\nredis = \"redis://127.0.0.1:6379/\"\ncapacity = 8\n\
                fail = \"closed\"\nlease_ttl = \"3s\"\n";
    let mut args = Args::default();
    args.cluster.lease_ttl = Some(Dur(Duration::from_secs(2)));
    let c = Config::resolve(Config::parse_file(text).unwrap(), &args).unwrap();
    let cluster = &c.cluster;
    assert_eq!(cluster.redis.as_deref(), Some("redis://127.0.0.1:6379/"));
    let closed = tailguard::admission::FailMode::Closed;
    assert_eq!((cluster.capacity, cluster.fail), (Some(8), closed));
    assert_eq!(cluster.lease_ttl, Duration::from_secs(2), "the flag wins");
    let c = Config::resolve(Config::parse_file(text).unwrap(), &Args::default()).unwrap();
    assert_eq!(c.cluster.lease_ttl, Duration::from_secs(3));
    let e = Config::resolve(
        Config::parse_file("[cluster]\nfail = \"ajar\"").unwrap(),
        &args,
    );
    assert!(e.unwrap_err().to_string().contains("cluster.fail"));
}

#[test]
fn the_deadline_header_liveness_and_propagation_keys() {
    let args = Args::parse_from(["gateway"]);
    let text = "[timeout]\nliveness = \"5s\"\ndeadline_header = \"x-deadline\"\n\
                propagate_deadline = true\n";
    let c = Config::resolve(Config::parse_file(text).unwrap(), &args).unwrap();
    assert_eq!(c.timeout.liveness, Some(Duration::from_secs(5)));
    assert_eq!(c.timeout.client_deadline().header().unwrap(), "x-deadline");
    assert!(c.timeout.propagate_deadline);

    let flags = [
        "gateway",
        "--deadline-header",
        "off",
        "--propagate-deadline",
        "on",
    ];
    let c = Config::resolve(FileConfig::default(), &Args::parse_from(flags)).unwrap();
    assert_eq!(c.timeout.client_deadline().header(), None);
    assert!(c.timeout.propagate_deadline);
    let args = Args::parse_from(["gateway", "--deadline-header", "bad header"]);
    let e = Config::resolve(FileConfig::default(), &args).unwrap_err();
    assert!(e.to_string().contains("timeout.deadline_header"), "{e}");
    let e = Args::try_parse_from(["gateway", "--outlier-ejection", "yes"]).unwrap_err();
    assert!(e.to_string().contains("--outlier-ejection"), "{e}");
}

#[test]
fn replica_slots_set_the_admission_capacity_unless_it_is_given() {
    let c = Config::resolve(
        Config::parse_file("[hedge]\nreplica_slots = 2").unwrap(),
        &Args::default(),
    );
    assert_eq!(c.unwrap().admission.capacity, 6, "2 slots x 3 mocks");
    let args = Args::parse_from([
        "gateway",
        "--replica-slots",
        "2",
        "--admission-capacity",
        "5",
    ]);
    assert_eq!(
        Config::resolve(FileConfig::default(), &args)
            .unwrap()
            .admission
            .capacity,
        5
    );
}

#[test]
fn the_help_shows_each_default() {
    let help = Args::command_with_defaults().render_long_help().to_string();
    assert!(help.contains("[default: 30s]"), "{help}");
    assert!(help.contains("[default: least-wait]"), "{help}");
    assert!(help.contains("TAILGUARD_ADMISSION_QUEUE_TIMEOUT"), "{help}");
}

/// What the README's configuration table gets wrong: each setting of [`Args`] has one row
/// with its file key, flag, variable and default (the first `code` of the cell), and every row
/// is a setting.
fn readme_mismatches(readme: &str) -> Vec<String> {
    let code = |cell: &str| cell.split('`').nth(1).unwrap_or("").to_owned();
    let section = readme.split("## The gateway: configuration").nth(1);
    let section = section.and_then(|s| s.split("\n## ").next()).unwrap_or("");
    let rows: Vec<Vec<String>> = (section.lines())
        .filter(|l| l.starts_with("| ") && !l.starts_with("| file key"))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect();
    let mut wrong = Vec::new();
    let settings = Args::settings();
    if rows.len() != settings.len() {
        wrong.push(format!(
            "{} rows for {} settings",
            rows.len(),
            settings.len()
        ));
    }
    for s in &settings {
        let flag = format!("--{}", s.flag);
        let key = if s.key == "config" { "" } else { s.key }; // a flag only
        let row = rows
            .iter()
            .find(|r| r.len() == 4 && code(&r[1]).split(' ').next() == Some(&flag));
        let Some(row) = row else {
            wrong.push(format!("no row for {flag}"));
            continue;
        };
        if (code(&row[0]).as_str(), code(&row[2]).as_str()) != (key, s.env) {
            wrong.push(format!("{flag}: the row says {row:?}, the setting {s:?}"));
        }
        if let Some(d) = s.default.filter(|d| !row[3].starts_with(&format!("`{d}`"))) {
            wrong.push(format!(
                "{flag}: the default is `{d}`, the row says {:?}",
                row[3]
            ));
        }
    }
    wrong
}

#[test]
fn the_readme_table_matches_the_settings() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    assert_eq!(readme_mismatches(&readme), Vec::<String>::new());
    // The check sees a changed default, variable or key, and a missing row.
    for (from, to) in [
        ("| `128` |", "| `256` |"),
        ("`TAILGUARD_ADMISSION_QUEUE_LEN`", "`TAILGUARD_QUEUE_LEN`"),
        ("| `admission.queue_len` |", "| `admission.queue_length` |"),
        (
            "| `admission.queue_len` |",
            "| `admission.queue` | `--queue` | | |\n| `x` |",
        ),
    ] {
        assert!(readme.contains(from), "{from}");
        assert_ne!(
            readme_mismatches(&readme.replacen(from, to, 1)),
            Vec::<String>::new()
        );
    }
    // Every flag of the command line is a setting.
    let flags: Vec<_> = Args::settings().iter().map(|s| s.flag).collect();
    for arg in Args::command()
        .get_arguments()
        .filter(|a| a.get_id() != "help")
    {
        assert!(flags.contains(&arg.get_id().as_str()), "{arg:?}");
        assert_eq!(arg.get_long(), Some(arg.get_id().as_str()));
    }
}

/// Issue 29, do no harm: with no replica capacity known, the defaults put no ceiling of the
/// gateway's own below its connection cap, and do not shrink it for slower first tokens; the
/// queue waits as long as the first-token limit allows.
#[test]
fn the_default_admission_refuses_nothing_a_plain_proxy_serves() {
    let c = Config::default();
    assert_eq!(c.admission.capacity as usize, c.max_connections);
    assert!(!c.admission.adaptive);
    assert_eq!(Some(c.admission.queue_timeout), c.timeout.first_token);
}

#[test]
fn the_shipped_file_resolves_and_named_tenants_replace_the_default_limits() {
    use tailguard::tenant::{Kind, Limit};
    let file = Config::parse_file(include_str!("../../gateway.toml")).unwrap();
    Config::resolve(file, &Args::default()).unwrap();
    let text = "[tenant]\noutput_tokens_per_minute = 100\n\
        named = [\"acme:weight=2\", \"vip:output_tokens_per_minute=1000\"]\n";
    let c = Config::resolve(Config::parse_file(text).unwrap(), &Args::default()).unwrap();
    let budgets = c.tenant.budgets();
    assert_eq!(
        budgets.limits("acme"),
        [Limit::per_minute(Kind::Output, 100)]
    );
    assert_eq!(
        budgets.limits("vip"),
        [Limit::per_minute(Kind::Output, 1000)]
    );
    let e = Config::parse_file("[tenant]\nnamed = [\"vip:tokens=5\"]\n")
        .and_then(|f| Config::resolve(f, &Args::default()))
        .unwrap_err();
    assert!(e.0.contains("tenant.named (--tenant)"), "{e}");
}
