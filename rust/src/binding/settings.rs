//! Typed settings at the boundary (issue 53): every config dict Python passes is read once into
//! a declared struct. The struct is the one list of the keys a kind takes: a key it does not
//! declare is `_core.UnknownSetting(key, kind, message)`, a required key that is absent (or
//! None) is `_core.MissingSetting(key, kind, message)`, a value not of the field's type (or out
//! of its range: a negative count) is `_core.WrongSetting(key, kind, message)`, and an optional
//! key's default is written next to its field. `_core.settings_keys(kind)` gives the keys to
//! Python (the stub test checks `_core.pyi` against them).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::{MissingSetting, UnknownSetting, WrongSetting};

/// A settings struct read from a config dict by [`settings!`].
pub(super) trait Settings: Sized {
    /// The name of the kind in errors and in `_core.settings_keys`.
    const KIND: &'static str;
    /// The keys it reads, its groups' (flattened into the same dict) included.
    fn keys() -> Vec<&'static str>;
    /// Its fields from `config`, without refusing unknown keys (the struct that holds it as a
    /// group does); a missing required key is named with `kind`, the outer struct's.
    fn fields(config: &Bound<'_, PyDict>, kind: &str) -> PyResult<Self>;
    /// The struct of `config`: unknown keys refused, required ones needed.
    fn from_config(config: &Bound<'_, PyDict>) -> PyResult<Self> {
        refuse_unknown(config, Self::KIND, &Self::keys())?;
        Self::fields(config, Self::KIND)
    }
}

/// `config[key]`, or `None` when the key is absent or its value is None (None is "not set").
pub(super) fn present<'py>(
    config: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(config.get_item(key)?.filter(|v| !v.is_none()))
}

/// The `MissingSetting` error of a required `key` of `kind`.
pub(super) fn missing(key: &str, kind: &str) -> PyErr {
    MissingSetting::new_err((
        key.to_string(),
        kind.to_string(),
        format!("the {kind} core needs the setting {key:?}"),
    ))
}

/// `error`, raised reading the value of `key` of `kind` as a `ty`, as the `WrongSetting` that
/// names the key, where it is a conversion's (`TypeError`, or `OverflowError` for a number out
/// of the type's range). A nested struct's own errors (its unknown or missing keys, which name
/// theirs) pass through unchanged.
pub(super) fn wrong_type(py: Python<'_>, error: PyErr, key: &str, kind: &str, ty: &str) -> PyErr {
    let conversion = error.is_instance_of::<pyo3::exceptions::PyTypeError>(py)
        || error.is_instance_of::<pyo3::exceptions::PyOverflowError>(py);
    if !conversion || error.is_instance_of::<WrongSetting>(py) {
        return error;
    }
    WrongSetting::new_err((
        key.to_string(),
        kind.to_string(),
        format!("the {kind} setting {key:?} must be a {ty}: {error}"),
    ))
}

/// The value of the tag key `tag` of a tagged settings dict (a vision spec's `family`, a
/// layout's `kind`), and the dict: an absent tag is `MissingSetting(tag, kind)`.
pub(super) fn tagged<'py>(
    obj: pyo3::Borrowed<'_, 'py, PyAny>,
    tag: &str,
    kind: &str,
) -> PyResult<(String, Bound<'py, PyDict>)> {
    let obj = obj.to_owned();
    let dict = obj.cast::<PyDict>()?.clone();
    let value: String = present(&dict, tag)?
        .ok_or_else(|| missing(tag, kind))?
        .extract()?;
    Ok((value, dict))
}

/// Refuses a key of `config` that `known` does not hold: a setting the binding of `kind` does
/// not read (misspelt, or meant for another kind) would otherwise be ignored, its default taken
/// in silence. The error names the key, the kind and the keys it takes.
fn refuse_unknown(config: &Bound<'_, PyDict>, kind: &str, known: &[&str]) -> PyResult<()> {
    for key in config.keys() {
        let key: String = key.extract()?;
        if !known.contains(&key.as_str()) {
            let mut takes = known.to_vec();
            takes.sort_unstable();
            return Err(UnknownSetting::new_err((
                key.clone(),
                kind.to_string(),
                format!(
                    "the {kind} core takes no setting {key:?} (it takes: {})",
                    takes.join(", ")
                ),
            )));
        }
    }
    Ok(())
}

/// Declares a settings struct and its [`Settings`] impl. A field `name: T` is required; `name:
/// T = default` is optional with that default (`Option<T> = None` for "not set"). A
/// `groups { name: G }` block holds other settings structs read from the same dict.
macro_rules! settings {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident ($kind:literal) {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty $(= $default:expr)? ),* $(,)?
        }
        $(groups { $( $(#[$gmeta:meta])* $gfield:ident : $gty:ty ),* $(,)? })?
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* pub(super) $field: $ty, )*
            $($( $(#[$gmeta])* pub(super) $gfield: $gty, )*)?
        }

        impl<'a, 'py> pyo3::FromPyObject<'a, 'py> for $name {
            type Error = pyo3::PyErr;

            /// A dict of these settings (a nested one: a spec, a layout).
            fn extract(obj: pyo3::Borrowed<'a, 'py, pyo3::PyAny>) -> pyo3::PyResult<Self> {
                let obj = obj.to_owned();
                let dict = obj.cast::<pyo3::types::PyDict>()?;
                <Self as $crate::binding::settings::Settings>::from_config(dict)
            }
        }

        impl $crate::binding::settings::Settings for $name {
            const KIND: &'static str = $kind;

            fn keys() -> Vec<&'static str> {
                #[allow(unused_mut)]
                let mut keys: Vec<&'static str> = vec![$(stringify!($field)),*];
                $($(
                    keys.extend(<$gty as $crate::binding::settings::Settings>::keys());
                )*)?
                keys
            }

            fn fields(
                config: &pyo3::Bound<'_, pyo3::types::PyDict>,
                kind: &str,
            ) -> pyo3::PyResult<Self> {
                let _ = kind;
                Ok(Self {
                    $( $field: settings!(@value config, kind, $field, $ty $(, $default)?), )*
                    $($(
                        $gfield: <$gty as $crate::binding::settings::Settings>::fields(
                            config, kind,
                        )?,
                    )*)?
                })
            }
        }
    };
    (@value $config:ident, $kind:ident, $field:ident, $ty:ty, $default:expr) => {
        match $crate::binding::settings::present($config, stringify!($field))? {
            Some(v) => settings!(@extract v, $kind, $field, $ty),
            None => $default,
        }
    };
    (@value $config:ident, $kind:ident, $field:ident, $ty:ty) => {
        {
            let v = $crate::binding::settings::present($config, stringify!($field))?
                .ok_or_else(|| $crate::binding::settings::missing(stringify!($field), $kind))?;
            settings!(@extract v, $kind, $field, $ty)
        }
    };
    // One conversion for both arms: a value not of the field's type names its key.
    (@extract $v:ident, $kind:ident, $field:ident, $ty:ty) => {
        $v.extract::<$ty>().map_err(|e| {
            $crate::binding::settings::wrong_type(
                $v.py(), e.into(), stringify!($field), $kind, stringify!($ty),
            )
        })?
    };
}
pub(super) use settings;

/// The keys the core's settings of `kind` take, sorted: "loader", "token count", "packed text",
/// "token-budget NaFlex", "interleaved", "interleaved captions layout", "interleaved
/// conversations layout", "QwenVL vision spec", "QwenVideo video rule", "NaFlexVL vision spec", "NaFlex spec", "source",
/// "sample", "caption tokenizer". An unknown kind is a `ValueError` naming the kinds.
#[pyfunction]
pub(super) fn settings_keys(kind: &str) -> PyResult<Vec<&'static str>> {
    use super::convert::{
        CaptionTokenizer, LoaderSettings, NaFlexSettings, SampleSettings, SourceSettings,
    };
    use super::interleaved::{
        CaptionsLayout, ConversationsLayout, InterleavedSettings, NaFlexVision, QwenVideoSettings,
        QwenVision,
    };
    use super::naflex::BudgetSettings;
    use super::text::{CountSettings, PackedSettings};
    use super::video::ClipSettings;
    type Keys = fn() -> Vec<&'static str>;
    let kinds: [(&str, Keys); 15] = [
        (LoaderSettings::KIND, LoaderSettings::keys),
        (CountSettings::KIND, CountSettings::keys),
        (PackedSettings::KIND, PackedSettings::keys),
        (BudgetSettings::KIND, BudgetSettings::keys),
        (InterleavedSettings::KIND, InterleavedSettings::keys),
        (CaptionsLayout::KIND, CaptionsLayout::keys),
        (ConversationsLayout::KIND, ConversationsLayout::keys),
        (QwenVision::KIND, QwenVision::keys),
        (NaFlexVision::KIND, NaFlexVision::keys),
        (QwenVideoSettings::KIND, QwenVideoSettings::keys),
        (SourceSettings::KIND, SourceSettings::keys),
        (SampleSettings::KIND, SampleSettings::keys),
        (NaFlexSettings::KIND, NaFlexSettings::keys),
        (CaptionTokenizer::KIND, CaptionTokenizer::keys),
        (ClipSettings::KIND, ClipSettings::keys),
    ];
    let Some((_, keys)) = kinds.iter().find(|(k, _)| *k == kind) else {
        let names: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "no settings of kind {kind:?} (the kinds: {})",
            names.join(", ")
        )));
    };
    let mut keys = keys();
    keys.sort_unstable();
    Ok(keys)
}
