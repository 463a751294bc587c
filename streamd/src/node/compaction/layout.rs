//! How one batch of cut windows becomes log entries and objects. A window's pieces of
//! the target size are per-stream objects of their own; the smaller last pieces of many
//! streams share objects of up to the target size, as AutoMQ packs small streams into
//! stream-set objects. So a batch costs a few PUTs and one `CompactStreams` entry, not
//! one of each per stream.

use weir_shared::ids::StreamId;

/// Most ranges one `CompactStreams` entry replaces (keeps log entries well under the
/// metadata log's message limit: about 100 bytes each).
pub const MAX_COMMAND_RANGES: usize = 4_000;

/// What layout needs to know of a window: its stream, how many ranges it replaces, and
/// the sizes of its pieces (every piece but the last holds at least the target).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowShape {
    pub stream: StreamId,
    pub replaced: usize,
    pub pieces: Vec<u64>,
}

/// One log entry: the windows it swaps (indexes into the batch), and its objects, each
/// a list of (window, piece).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryLayout {
    pub windows: Vec<usize>,
    pub objects: Vec<Vec<(usize, usize)>>,
}

/// Lays out `windows` (in batch order) as entries: each replaces at most
/// `max_ranges` ranges and holds a stream at most once (a swap per stream per entry,
/// and a stream has at most one range in any object). Pieces of at least `target`
/// bytes are objects of their own; smaller ones are packed, in order, into shared
/// objects of up to `target` bytes.
pub fn layout(windows: &[WindowShape], target: u64, max_ranges: usize) -> Vec<EntryLayout> {
    let mut entries: Vec<EntryLayout> = Vec::new();
    let mut open = EntryLayout::default();
    let mut ranges = 0;
    // The shared object being filled in `open`, and its bytes.
    let mut shared: Option<(usize, u64)> = None;
    for (w, shape) in windows.iter().enumerate() {
        let repeats = open.windows.iter().any(|&o| windows[o].stream == shape.stream);
        if !open.windows.is_empty() && (repeats || ranges + shape.replaced > max_ranges) {
            entries.push(std::mem::take(&mut open));
            ranges = 0;
            shared = None;
        }
        open.windows.push(w);
        ranges += shape.replaced;
        for (p, &size) in shape.pieces.iter().enumerate() {
            if size >= target {
                open.objects.push(vec![(w, p)]);
                continue;
            }
            match &mut shared {
                Some((object, bytes)) if *bytes + size <= target => {
                    open.objects[*object].push((w, p));
                    *bytes += size;
                }
                _ => {
                    open.objects.push(vec![(w, p)]);
                    shared = Some((open.objects.len() - 1, size));
                }
            }
        }
    }
    if !open.windows.is_empty() {
        entries.push(open);
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(stream: u64, replaced: usize, pieces: &[u64]) -> WindowShape {
        WindowShape {
            stream: StreamId(stream),
            replaced,
            pieces: pieces.to_vec(),
        }
    }

    // Issue 16, D-20: many streams' small windows cost one entry and one shared object.
    #[test]
    fn small_windows_of_many_streams_share_one_entry_and_object() {
        let windows: Vec<_> = (0..50).map(|s| shape(s, 10, &[1_000])).collect();
        let entries = layout(&windows, 100_000, MAX_COMMAND_RANGES);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].windows, (0..50).collect::<Vec<_>>());
        assert_eq!(entries[0].objects, vec![(0..50).map(|w| (w, 0)).collect::<Vec<_>>()]);
    }

    #[test]
    fn full_pieces_get_their_own_objects_and_shared_ones_stay_under_the_target() {
        let windows = vec![
            shape(0, 5, &[100, 100, 30]),
            shape(1, 5, &[60]),
            shape(2, 5, &[50]),
            shape(3, 5, &[20]),
        ];
        let entries = layout(&windows, 100, MAX_COMMAND_RANGES);
        assert_eq!(entries.len(), 1);
        assert_eq!(
            entries[0].objects,
            vec![vec![(0, 0)], vec![(0, 1)], vec![(0, 2), (1, 0)], vec![(2, 0), (3, 0)],]
        );
    }

    #[test]
    fn an_entry_holds_a_stream_once_and_at_most_the_range_limit() {
        let windows = vec![
            shape(0, 3, &[1]),
            shape(1, 3, &[1]),
            shape(0, 3, &[1]),
            shape(2, 5, &[1]),
        ];
        let entries = layout(&windows, 100, 8);
        let got: Vec<Vec<usize>> = entries.iter().map(|e| e.windows.clone()).collect();
        // Stream 0's second window opens a new entry; 3 + 5 fits, then the limit.
        assert_eq!(got, vec![vec![0, 1], vec![2, 3]]);
        // Objects never span entries.
        assert_eq!(entries[1].objects, vec![vec![(2, 0), (3, 0)]]);
        let every: Vec<usize> = entries.iter().flat_map(|e| e.windows.clone()).collect();
        assert_eq!(every, vec![0, 1, 2, 3], "no window lost or repeated");
    }
}
