//! The PyO3 layer: thin wrappers that convert arguments, release the GIL around Rust work, and
//! turn faults into Python exceptions. No logic lives here. One file a Python-facing area:
//! `pipeline` (the running pipeline of any kind), `loader` (starting the sample kinds'),
//! `plan` (plans, mixtures, the spans a reader reads),
//! `index` (indexes and their subsets), `scan` (raw samples, shard validation, one image on its
//! own), `tokenizer` (the tokenizer on its own), `text` (the packed text kind), `naflex` (the NaFlex
//! kind's token-budget batches), `interleaved` (the VLM documents kind), `units` (what the kinds planned over unit weights share), `video` (the video kind's frame
//! sampling and sizing, pure computation), `settings` (the typed config
//! structs every config dict is read into), `errors` (the exception and the errors it carries) and
//! `convert` (config dicts and JSON to and from Rust types).

use pyo3::prelude::*;

mod convert;
mod errors;
mod index;
mod interleaved;
mod loader;
mod naflex;
mod pipeline;
mod plan;
mod scan;
mod settings;
mod text;
mod tokenizer;
mod units;
mod video;

use convert::defaults_dict;
use errors::{CoreFault, FfmpegUnavailable, MissingSetting, UnknownSetting, WrongSetting};
use index::DatasetIndex;
use pipeline::Pipeline;
use plan::{EpochPlanView, MixturePlan, PlanRequest, PlannedSpans};
use scan::SampleIter;
use tokenizer::PyClipTokenizer;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CoreFault", m.py().get_type::<CoreFault>())?;
    m.add("UnknownSetting", m.py().get_type::<UnknownSetting>())?;
    m.add("MissingSetting", m.py().get_type::<MissingSetting>())?;
    m.add("WrongSetting", m.py().get_type::<WrongSetting>())?;
    m.add("FfmpegUnavailable", m.py().get_type::<FfmpegUnavailable>())?;
    m.add("DEFAULTS", defaults_dict(m.py())?)?;
    m.add_class::<SampleIter>()?;
    m.add_class::<Pipeline>()?;
    m.add_function(wrap_pyfunction!(loader::sample_pipeline, m)?)?;
    m.add_class::<DatasetIndex>()?;
    m.add_class::<PlanRequest>()?;
    m.add_class::<EpochPlanView>()?;
    m.add_class::<MixturePlan>()?;
    m.add_class::<PlannedSpans>()?;
    m.add_class::<PyClipTokenizer>()?;
    m.add_function(wrap_pyfunction!(text::packed_pipeline, m)?)?;
    m.add_function(wrap_pyfunction!(naflex::budget_pipeline, m)?)?;
    m.add_function(wrap_pyfunction!(naflex::count_patches, m)?)?;
    m.add_function(wrap_pyfunction!(interleaved::interleaved_pipeline, m)?)?;
    m.add_function(wrap_pyfunction!(interleaved::count_interleaved, m)?)?;
    m.add_function(wrap_pyfunction!(interleaved::interleaved_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(text::count_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(text::packed_plan_counts, m)?)?;
    m.add_function(wrap_pyfunction!(text::packed_encoder, m)?)?;
    m.add_function(wrap_pyfunction!(text::packed_fast_path, m)?)?;
    m.add_function(wrap_pyfunction!(text::packed_encode, m)?)?;
    m.add_function(wrap_pyfunction!(scan::scan_shard, m)?)?;
    m.add_function(wrap_pyfunction!(scan::probe_image, m)?)?;
    m.add_function(wrap_pyfunction!(scan::decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(errors::py_redact_url, m)?)?;
    m.add_function(wrap_pyfunction!(plan::derive_seed, m)?)?;
    m.add_function(wrap_pyfunction!(plan::assign_shards, m)?)?;
    m.add_function(wrap_pyfunction!(settings::settings_keys, m)?)?;
    m.add_function(wrap_pyfunction!(video::video_sample_frames, m)?)?;
    m.add_function(wrap_pyfunction!(video::video_clip_frames, m)?)?;
    m.add_function(wrap_pyfunction!(video::video_frame_size, m)?)?;
    m.add_function(wrap_pyfunction!(video::video_probe, m)?)?;
    m.add_function(wrap_pyfunction!(video::video_decode_frames, m)?)?;
    m.add_function(wrap_pyfunction!(video::count_clips, m)?)?;
    m.add_function(wrap_pyfunction!(video::video_pipeline, m)?)?;
    Ok(())
}
