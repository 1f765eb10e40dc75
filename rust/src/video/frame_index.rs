//! Which packets a clip's sampled frames need decoded, from its packets' timestamps and
//! keyframe flags alone (a demux pass; nothing decoded): frame `n` is the packet with the
//! `n`-th smallest presentation time, as TorchCodec's exact mode numbers them.
//!
//! A sampled frame needs the packets from the last keyframe at or before it (in decode order,
//! and not displayed after it) up to its own; every other packet is dropped unread by the
//! decoder, and inside those runs a packet whose frame is not sampled is decoded only if other
//! frames refer to it (the decoder skips it when it is a non-reference frame).

/// One video packet, in decode order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Presentation time (stream time base).
    pub pts: i64,
    /// A keyframe: decoding can start here.
    pub key: bool,
}

/// What the decoder does with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Not needed: not sent.
    Drop,
    /// Its frame is sampled: decoded.
    Decode,
    /// Needed only as a reference for a sampled frame: decoded unless it is a non-reference
    /// frame (then the decoder skips it).
    Reference,
}

/// The packets of a clip by presentation time.
#[derive(Debug)]
pub struct FrameIndex {
    packets: Vec<Packet>,
    /// (pts, packet position), sorted by pts: frame `n` is `by_time[n]`.
    by_time: Vec<(i64, usize)>,
}

impl FrameIndex {
    /// None where frames cannot be numbered by time: a packet without a presentation time, or
    /// two with the same one (the decoder then numbers frames in the order it outputs them).
    pub fn new(packets: Vec<Packet>, no_time: i64) -> Option<Self> {
        if packets.iter().any(|p| p.pts == no_time) {
            return None;
        }
        let mut by_time: Vec<(i64, usize)> = packets
            .iter()
            .enumerate()
            .map(|(i, p)| (p.pts, i))
            .collect();
        by_time.sort_unstable();
        if by_time.windows(2).any(|w| w[0].0 == w[1].0) {
            return None;
        }
        Some(FrameIndex { packets, by_time })
    }

    /// The clip's frames (one per packet).
    pub fn frames(&self) -> usize {
        self.by_time.len()
    }

    /// The frame number of a decoded frame's presentation time.
    pub fn frame_at(&self, pts: i64) -> Option<u32> {
        self.by_time
            .binary_search_by_key(&pts, |&(t, _)| t)
            .ok()
            .map(|n| n as u32)
    }

    /// One action per packet, for the frames `wanted` (each < `frames()`).
    pub fn plan(&self, wanted: &[u32]) -> Vec<Action> {
        let mut actions = vec![Action::Drop; self.packets.len()];
        for &n in wanted {
            let (pts, at) = self.by_time[n as usize];
            // The last keyframe at or before the frame's packet that is not displayed after it.
            let start = (0..=at)
                .rev()
                .find(|&i| self.packets[i].key && self.packets[i].pts <= pts)
                .unwrap_or(0);
            for action in &mut actions[start..at] {
                if *action == Action::Drop {
                    *action = Action::Reference;
                }
            }
            actions[at] = Action::Decode;
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    const NO_TIME: i64 = i64::MIN;

    /// An IPBB... stream: keyframes every `gop` frames, each GOP coded I P B B P B B ... (the
    /// P after two Bs displayed after them).
    fn stream(frames: usize, gop: usize) -> Vec<Packet> {
        let mut packets = Vec::new();
        let mut start = 0;
        while start < frames {
            let end = (start + gop).min(frames);
            packets.push(Packet {
                pts: start as i64,
                key: true,
            });
            let mut i = start + 1;
            while i < end {
                let p = (i + 2).min(end - 1);
                packets.push(Packet {
                    pts: p as i64,
                    key: false,
                });
                for b in i..p {
                    packets.push(Packet {
                        pts: b as i64,
                        key: false,
                    });
                }
                i = p + 1;
            }
            start = end;
        }
        packets
    }

    #[test]
    fn frames_are_numbered_by_presentation_time() {
        let index = FrameIndex::new(stream(12, 6), NO_TIME).unwrap();
        assert_eq!(index.frames(), 12);
        for n in 0..12 {
            assert_eq!(index.frame_at(n as i64), Some(n));
        }
        assert_eq!(index.frame_at(12), None);
    }

    #[test]
    fn a_frame_needs_its_keyframe_onwards_and_nothing_after_it() {
        // Decode order of two GOPs of 6: I0 P3 B1 B2 P5 B4 | I6 P9 B7 B8 P11 B10.
        let index = FrameIndex::new(stream(12, 6), NO_TIME).unwrap();
        // Frame 8 (B8, packet 9): I6, P9, B7 as references, B8 decoded; the first GOP dropped.
        assert_eq!(
            index.plan(&[8]),
            vec![
                Drop, Drop, Drop, Drop, Drop, Drop, Reference, Reference, Reference, Decode, Drop,
                Drop
            ]
        );
        // Frames 0 and 4: the first GOP's packets to B4.
        assert_eq!(
            index.plan(&[4, 0]),
            vec![
                Decode, Reference, Reference, Reference, Reference, Decode, Drop, Drop, Drop, Drop,
                Drop, Drop
            ]
        );
    }

    #[test]
    fn frames_without_times_or_with_equal_ones_are_not_indexed() {
        let mut packets = stream(6, 6);
        packets[2].pts = NO_TIME;
        assert!(FrameIndex::new(packets, NO_TIME).is_none());
        let mut packets = stream(6, 6);
        packets[2].pts = packets[3].pts;
        assert!(FrameIndex::new(packets, NO_TIME).is_none());
    }

    #[test]
    fn a_keyframe_displayed_after_the_frame_is_not_a_start() {
        // Open GOP: I0 P2 B1 | I4 (key) B3 (a leading frame, displayed before I4) P5.
        let packets = [
            (0, true),
            (2, false),
            (1, false),
            (4, true),
            (3, false),
            (5, false),
        ]
        .map(|(pts, key)| Packet { pts, key })
        .to_vec();
        let index = FrameIndex::new(packets, NO_TIME).unwrap();
        // Frame 3 (packet 4) starts from I0, not from I4 which is displayed after it.
        assert_eq!(
            index.plan(&[3]),
            vec![Reference, Reference, Reference, Reference, Decode, Drop]
        );
        assert_eq!(
            index.plan(&[5]),
            vec![Drop, Drop, Drop, Reference, Reference, Decode]
        );
    }
}
