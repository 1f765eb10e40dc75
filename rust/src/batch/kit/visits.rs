//! A reader's visits: the ranges of a planned stream (`plan::unit_stream`) it reads, per unit
//! touched, in order. Every planned kind's read thread walks its visits, opening each unit once.

use crate::plan::unit_stream::{Span, UnitOrder};

/// One unit's part of a reader: unit-local ranges of positions (tokens, or the budget kind's
/// batches), ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Visit {
    pub unit: u32,
    pub spans: Vec<(u64, u64)>,
}

/// The visits that read `ranges` of the stream `order` lays out.
pub(crate) fn visits(order: &UnitOrder, ranges: &[Span]) -> Vec<Visit> {
    let mut out: Vec<Visit> = Vec::new();
    let mut last_pos = usize::MAX;
    for r in ranges {
        let mut at = r.start;
        while at < r.end {
            let pos = order.locate(at);
            let (lo, hi) = (order.starts[pos], order.starts[pos + 1]);
            let end = r.end.min(hi);
            let span = (at - lo, end - lo);
            if pos == last_pos {
                let visit = out.last_mut().expect("a visit");
                match visit.spans.last_mut() {
                    Some(last) if last.1 == span.0 => last.1 = span.1,
                    _ => visit.spans.push(span),
                }
            } else {
                out.push(Visit {
                    unit: order.order[pos],
                    spans: vec![span],
                });
                last_pos = pos;
            }
            at = end;
        }
    }
    out
}
