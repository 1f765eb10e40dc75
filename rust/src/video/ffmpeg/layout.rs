//! Where the decoder's fields sit in FFmpeg's structures, per release: the "shim per major" of
//! the video guide, as offsets rather than compiled C. FFmpeg moves fields between majors
//! (FFmpeg 6.1 put an `av_class` at the head of `AVStream`; 7 moved its side data into
//! `codecpar`), so each release gets a table, checked against that release's own headers by
//! `tests/test_video_decode.py::test_ffmpeg_layout_matches_the_headers` (a C program prints
//! `offsetof` of each field) wherever those headers are installed.
//!
//! Only FFmpeg 5 (libavformat 59, Debian 12's) has a table so far: a release without one is
//! refused by name at load time, never read with another release's offsets.

/// Byte offsets of the fields read or written through raw pointers.
#[derive(Debug, PartialEq, Eq)]
pub struct Layout {
    /// AVFormatContext.pb (AVIOContext*), written before `avformat_open_input`.
    pub format_pb: usize,
    /// AVFormatContext.nb_streams (unsigned int).
    pub format_nb_streams: usize,
    /// AVFormatContext.streams (AVStream**).
    pub format_streams: usize,
    /// AVFormatContext.duration (int64, AV_TIME_BASE units).
    pub format_duration: usize,
    /// AVIOContext.buffer (unsigned char*), freed by us after the context.
    pub io_buffer: usize,
    /// AVStream.codecpar (AVCodecParameters*).
    pub stream_codecpar: usize,
    /// AVStream.time_base (AVRational).
    pub stream_time_base: usize,
    /// AVStream.duration (int64, time_base units).
    pub stream_duration: usize,
    /// AVStream.nb_frames (int64; 0 where the container does not say).
    pub stream_nb_frames: usize,
    /// AVStream.avg_frame_rate (AVRational).
    pub stream_avg_frame_rate: usize,
    /// AVCodecParameters.codec_type (int).
    pub par_codec_type: usize,
    /// AVCodecParameters.codec_id (int).
    pub par_codec_id: usize,
    /// AVCodecParameters.width / height (int).
    pub par_width: usize,
    pub par_height: usize,
    /// AVPacket.pts (int64), stream_index (int) and flags (int; AV_PKT_FLAG_KEY = 1).
    pub packet_pts: usize,
    pub packet_stream_index: usize,
    pub packet_flags: usize,
    /// AVFrame.data (uint8_t*[8]) and linesize (int[8]).
    pub frame_data: usize,
    pub frame_linesize: usize,
    /// AVFrame.width / height / format (int).
    pub frame_width: usize,
    pub frame_height: usize,
    pub frame_format: usize,
    /// AVFrame.color_range / colorspace (enums, int).
    pub frame_color_range: usize,
    pub frame_colorspace: usize,
    /// AVFrame.best_effort_timestamp (int64): the frame's presentation time as FFmpeg guesses
    /// it best.
    pub frame_best_effort_timestamp: usize,
}

/// FFmpeg 5.x: libavformat 59, libavcodec 59, libavutil 57, libswscale 6.
pub const FFMPEG_5: Layout = Layout {
    format_pb: 32,
    format_nb_streams: 44,
    format_streams: 48,
    format_duration: 72,
    io_buffer: 8,
    stream_codecpar: 208,
    stream_time_base: 16,
    stream_duration: 32,
    stream_nb_frames: 40,
    stream_avg_frame_rate: 72,
    par_codec_type: 0,
    par_codec_id: 4,
    par_width: 56,
    par_height: 60,
    packet_pts: 8,
    packet_stream_index: 36,
    packet_flags: 40,
    frame_data: 0,
    frame_linesize: 64,
    frame_width: 104,
    frame_height: 108,
    frame_format: 116,
    frame_color_range: 320,
    frame_colorspace: 332,
    frame_best_effort_timestamp: 344,
};

impl Layout {
    /// The table for a libavformat major, if this build has one.
    pub fn for_avformat_major(major: u32) -> Option<&'static Layout> {
        match major {
            59 => Some(&FFMPEG_5),
            _ => None,
        }
    }

    /// (C struct, field, offset) for every entry: what the header check compares.
    pub fn entries(&self) -> Vec<(&'static str, &'static str, usize)> {
        vec![
            ("AVFormatContext", "pb", self.format_pb),
            ("AVFormatContext", "nb_streams", self.format_nb_streams),
            ("AVFormatContext", "streams", self.format_streams),
            ("AVFormatContext", "duration", self.format_duration),
            ("AVIOContext", "buffer", self.io_buffer),
            ("AVStream", "codecpar", self.stream_codecpar),
            ("AVStream", "time_base", self.stream_time_base),
            ("AVStream", "duration", self.stream_duration),
            ("AVStream", "nb_frames", self.stream_nb_frames),
            ("AVStream", "avg_frame_rate", self.stream_avg_frame_rate),
            ("AVCodecParameters", "codec_type", self.par_codec_type),
            ("AVCodecParameters", "codec_id", self.par_codec_id),
            ("AVCodecParameters", "width", self.par_width),
            ("AVCodecParameters", "height", self.par_height),
            ("AVPacket", "pts", self.packet_pts),
            ("AVPacket", "stream_index", self.packet_stream_index),
            ("AVPacket", "flags", self.packet_flags),
            ("AVFrame", "data", self.frame_data),
            ("AVFrame", "linesize", self.frame_linesize),
            ("AVFrame", "width", self.frame_width),
            ("AVFrame", "height", self.frame_height),
            ("AVFrame", "format", self.frame_format),
            ("AVFrame", "color_range", self.frame_color_range),
            ("AVFrame", "colorspace", self.frame_colorspace),
            (
                "AVFrame",
                "best_effort_timestamp",
                self.frame_best_effort_timestamp,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Each offset of FFmpeg 5's table against `offsetof` in the installed FFmpeg 5 headers
    /// (Debian's libav*-dev, which scripts/env.sh installs): a C program prints them.
    #[test]
    fn ffmpeg_5_layout_matches_the_headers() {
        let flags = Command::new("pkg-config")
            .args(["--cflags", "libavformat", "libavcodec", "libavutil"])
            .output()
            .expect("pkg-config runs (scripts/env.sh installs it with FFmpeg's headers)");
        assert!(
            flags.status.success(),
            "FFmpeg's headers are missing: scripts/env.sh installs libavformat-dev"
        );
        let version = Command::new("pkg-config")
            .args(["--modversion", "libavformat"])
            .output()
            .unwrap();
        let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
        assert!(
            version.starts_with("59."),
            "the installed headers are libavformat {version}, not FFmpeg 5's 59: this test \
             checks FFmpeg 5's table"
        );
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <libavformat/avformat.h>\n\
             #include <libavcodec/avcodec.h>\nint main(void) {\n",
        );
        let entries = FFMPEG_5.entries();
        for (ty, field, _) in &entries {
            c.push_str(&format!("printf(\"%zu\\n\", offsetof({ty}, {field}));\n"));
        }
        c.push_str("return 0;\n}\n");
        let dir = std::env::temp_dir().join(format!("shardstream-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
        std::fs::write(&src, c).unwrap();
        let mut cc = Command::new("cc");
        cc.arg(&src).arg("-o").arg(&exe);
        for flag in String::from_utf8_lossy(&flags.stdout).split_whitespace() {
            cc.arg(flag);
        }
        let built = cc.output().expect("a C compiler runs");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let printed = Command::new(&exe).output().unwrap();
        std::fs::remove_dir_all(&dir).ok();
        let offsets: Vec<usize> = String::from_utf8_lossy(&printed.stdout)
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(offsets.len(), entries.len());
        for ((ty, field, ours), theirs) in entries.iter().zip(offsets) {
            assert_eq!(*ours, theirs, "{ty}.{field}");
        }
    }

    #[test]
    fn only_releases_with_a_table_are_read() {
        assert_eq!(Layout::for_avformat_major(59), Some(&FFMPEG_5));
        assert_eq!(Layout::for_avformat_major(60), None);
        assert_eq!(Layout::for_avformat_major(61), None);
    }
}
