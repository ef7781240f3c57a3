//! `settings!`: declares a section of the configuration once, and derives from it the flags and
//! environment variables (clap), the file section (serde), the resolved values, the defaults
//! and the checks.

/// Declares `$args` (every setting an `Option` of its value as written: a flag, its environment
/// variable, or the file key of the same name, unknown keys refused) and `$config` (the resolved
/// values). Each setting is written once:
///
/// ```text
/// /// Help text (the doc comment), and why the default is what it is.
/// #[arg(long = "flag", env = "TAILGUARD_FLAG", value_name = "N")]
/// key: Written => Resolved = "default", check fn;
/// ```
///
/// `=> Resolved` (else the written type), `= "default"` (in the syntax of the flag, parsed by
/// the written type's `FromStr`; else the resolved type's `Default`) and `check fn`
/// (`fn(Written) -> Result<T, String>`, `T: Into<Resolved>`) are optional.
/// `[name]: SubArgs => SubConfig;` nests a section.
macro_rules! settings {
    (@ty $raw:ty) => { $raw };
    (@ty $raw:ty, $ty:ty) => { $ty };
    (@default $raw:ty) => { None };
    (@default $raw:ty, $d:expr) => {
        Some(<$raw as std::str::FromStr>::from_str($d).expect("a default parses"))
    };
    (@unset) => { Default::default() };
    (@unset $d:expr) => { unreachable!("merged with the defaults") };
    (@opt) => { None };
    (@opt $d:expr) => { Some($d) };
    (@check $v:ident) => { Ok::<_, String>($v) };
    (@check $v:ident, $check:path) => { $check($v) };
    (
        $(#[$meta:meta])*
        pub struct $args:ident => $config:ident, keys $prefix:literal {
            $(
                $(#[doc = $doc:literal])*
                #[arg(long = $flag:literal, env = $env:literal $(, $k:ident = $v:expr)* $(,)?)]
                $(#[$fattr:meta])*
                $field:ident: $raw:ty $(=> $ty:ty)? $(= $default:expr)? $(, check $check:path)?;
            )*
            $( [$sec:ident]: $sargs:ident => $scfg:ident; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(serde::Deserialize, Debug, Default, Clone)]
        #[serde(deny_unknown_fields, default)]
        pub struct $args {
            $(
                $(#[doc = $doc])*
                #[arg(id = $flag, long = $flag, env = $env $(, $k = $v)*)]
                $(#[$fattr])*
                pub $field: Option<$raw>,
            )*
            $(
                #[doc = concat!("`[", stringify!($sec), "]`")]
                #[command(flatten)]
                pub $sec: $sargs,
            )*
        }

        #[doc = concat!("The resolved [`", stringify!($args), "`]: checked, defaults filled in.")]
        #[derive(Debug, Clone)]
        pub struct $config {
            $( $(#[doc = $doc])* pub $field: settings!(@ty $raw $(, $ty)?), )*
            $( #[doc = concat!("`[", stringify!($sec), "]`")] pub $sec: $scfg, )*
        }

        impl $args {
            /// The values set here, else `other`'s.
            pub fn or(self, other: Self) -> Self {
                Self {
                    $( $field: self.$field.or(other.$field), )*
                    $( $sec: self.$sec.or(other.$sec), )*
                }
            }

            /// The defaults, as the flags would give them.
            pub fn defaults() -> Self {
                Self {
                    $( $field: settings!(@default $raw $(, $default)?), )*
                    $( $sec: $sargs::defaults(), )*
                }
            }

            /// Every setting of this section and the sections in it.
            pub(crate) fn collect_settings(out: &mut Vec<$crate::config::Setting>) {
                $(out.push($crate::config::Setting {
                    key: concat!($prefix, stringify!($field)),
                    flag: $flag,
                    env: $env,
                    default: settings!(@opt $($default)?),
                });)*
                $( $sargs::collect_settings(out); )*
            }

            /// Checks each value and resolves it (an unset one without a default to its type's
            /// `Default`); called on values merged with [`Self::defaults`].
            pub(crate) fn into_config(self) -> Result<$config, $crate::config::ConfigError> {
                Ok($config {
                    $($field: match self.$field {
                        Some(v) => settings!(@check v $(, $check)?).map(Into::into).map_err(|e| {
                            $crate::config::ConfigError(format!(
                                "{}{} (--{}): {e}", $prefix, stringify!($field), $flag
                            ))
                        })?,
                        None => settings!(@unset $($default)?),
                    },)*
                    $( $sec: self.$sec.into_config()?, )*
                })
            }
        }
    };
}
