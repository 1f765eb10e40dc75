//! The NaFlex kind's token-budget batches: each batch as many images as fit
//! `max_patches_per_batch` patches, grouped by length bucket (`plan::budget`), with an exact
//! epoch planned over the batches every unit holds (`plan::unit_stream`, batches as its positions).
//!
//! `samples` (a unit's samples and the patch count each would get), `count` (the count pass:
//! batches per unit, once, like the text kind's token counts) and `pipeline` (one reader: its
//! units read in file order, its planned batches kept and decoded into the buffers lent to it).

mod count;
mod pipeline;
mod samples;

pub use count::{count_unit, BudgetCount};
pub use pipeline::{start, BudgetBatchMeta, BudgetBatches, BudgetInput, BudgetPipeline};
pub use samples::BudgetSpec;
