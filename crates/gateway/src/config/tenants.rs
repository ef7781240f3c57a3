//! `[tenant]`: who each request is for, and the token budgets of tenants (issue 34).

use tailguard::priority::TenantLayer;
use tailguard::tenant::{Kind, Limit, TokenBudgetLayer};

use super::TenantConfig;

/// The limit keys of a tenant, as in the file and in a [`TenantSpec`]: `{kind}_tokens_per_{window}`.
const LIMIT_KEYS: [(&str, Kind, bool); 6] = [
    ("input_tokens_per_minute", Kind::Input, false),
    ("output_tokens_per_minute", Kind::Output, false),
    ("total_tokens_per_minute", Kind::Total, false),
    ("input_tokens_per_day", Kind::Input, true),
    ("output_tokens_per_day", Kind::Output, true),
    ("total_tokens_per_day", Kind::Total, true),
];

fn limit(kind: Kind, per_day: bool, tokens: u64) -> Limit {
    if per_day {
        Limit::per_day(kind, tokens)
    } else {
        Limit::per_minute(kind, tokens)
    }
}

/// A named tenant: `NAME` or `NAME:key=value,...` with `weight` (its share of contended
/// capacity against tenants of weight 1) and any limit key of `[tenant]`
/// (`output_tokens_per_minute=1000`); a tenant that names no limit has the default ones.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantSpec {
    /// The tenant's name (its `x-tenant` value).
    pub name: String,
    /// Its weight.
    pub weight: f64,
    /// Its limits, replacing the default ones; `None`: the defaults.
    pub limits: Option<Vec<Limit>>,
}

impl std::str::FromStr for TenantSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, rest) = s.trim().split_once(':').unwrap_or((s.trim(), ""));
        if name.is_empty() {
            return Err(format!("`{s}`: a tenant needs a name"));
        }
        let mut spec = TenantSpec {
            name: name.to_owned(),
            weight: 1.0,
            limits: None,
        };
        for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` in `{s}`: expected key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            if key == "weight" {
                spec.weight = value
                    .parse::<f64>()
                    .ok()
                    .filter(|w| w.is_finite() && *w > 0.0)
                    .ok_or_else(|| format!("`{pair}` in `{s}`: a weight is a positive number"))?;
                continue;
            }
            let Some(&(_, kind, per_day)) = LIMIT_KEYS.iter().find(|(k, ..)| *k == key) else {
                return Err(format!(
                    "`{key}` in `{s}`: expected weight or one of {}",
                    LIMIT_KEYS.map(|(k, ..)| k).join(", ")
                ));
            };
            let tokens = value
                .parse::<u64>()
                .map_err(|_| format!("`{pair}` in `{s}`: a number of tokens"))?;
            (spec.limits.get_or_insert_with(Vec::new)).push(limit(kind, per_day, tokens));
        }
        Ok(spec)
    }
}

/// Parses each named tenant (the check of `tenant.named`).
pub(super) fn tenant_specs(specs: Vec<String>) -> Result<Vec<TenantSpec>, String> {
    specs.iter().map(|s| s.parse()).collect()
}

impl TenantConfig {
    /// The limits every tenant has unless named with its own.
    pub fn default_limits(&self) -> Vec<Limit> {
        let set = [
            self.input_tokens_per_minute,
            self.output_tokens_per_minute,
            self.total_tokens_per_minute,
            self.input_tokens_per_day,
            self.output_tokens_per_day,
            self.total_tokens_per_day,
        ];
        (LIMIT_KEYS.iter().zip(set))
            .filter_map(|(&(_, kind, per_day), n)| Some(limit(kind, per_day, n?)))
            .collect()
    }

    /// Who each request is for: the header, else the API key; named tenants' weights.
    pub fn identity(&self) -> TenantLayer {
        let mut layer = match &self.header {
            Some(h) => TenantLayer::new().with_header(h.clone()),
            None => TenantLayer::new().without_header(),
        }
        .with_api_key(self.api_key)
        .with_label_limit(self.label_limit);
        for t in &self.named {
            layer = layer.with_tenant(t.name.as_str(), t.weight);
        }
        layer
    }

    /// The token budgets (with no limit set, every request passes untouched).
    pub fn budgets(&self) -> TokenBudgetLayer {
        let mut layer = TokenBudgetLayer::new()
            .with_default_limits(self.default_limits())
            .with_default_max_tokens(self.default_max_tokens);
        for t in &self.named {
            if let Some(limits) = &t.limits {
                layer = layer.with_tenant_limits(t.name.as_str(), limits.iter().copied());
            }
        }
        layer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_or_say_why_not() {
        let s: TenantSpec = "acme:weight=2, output_tokens_per_minute=1000,total_tokens_per_day=9"
            .parse()
            .unwrap();
        assert_eq!((s.name.as_str(), s.weight), ("acme", 2.0));
        assert_eq!(
            s.limits.unwrap(),
            [
                Limit::per_minute(Kind::Output, 1000),
                Limit::per_day(Kind::Total, 9)
            ]
        );
        let plain: TenantSpec = "batch-team".parse().unwrap();
        assert_eq!((plain.weight, plain.limits), (1.0, None));
        for (bad, why) in [
            (":weight=2", "needs a name"),
            ("a:weight=0", "positive"),
            ("a:weight", "key=value"),
            ("a:tokens=5", "expected weight or one of"),
            ("a:output_tokens_per_minute=-1", "a number of tokens"),
        ] {
            let e = bad.parse::<TenantSpec>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
