//! SPDY/3.1 frames as kubectl (through the apiserver) speaks them to a kubelet: the control
//! frames a stream multiplexer needs and data frames. Pure: bytes in, frames out, and back; the
//! header blocks go through one zlib stream per direction with the SPDY dictionary.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::dictionary::dictionary;

pub(crate) const VERSION: u16 = 3;
/// The last frame of a stream in this direction.
pub(crate) const FLAG_FIN: u8 = 0x01;
/// A control frame's 24-bit length allows 16 MiB; no frame we accept needs more than this
/// (kubectl's data frames are at most 32 KiB, its header blocks a few hundred bytes).
pub(crate) const MAX_FRAME: usize = 256 * 1024;
/// A decompressed header block larger than this is refused (a zlib bomb).
const MAX_HEADERS: usize = 256 * 1024;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes used here.
pub(crate) const RST_REFUSED_STREAM: u32 = 3;
pub(crate) const RST_CANCEL: u32 = 5;

/// Header names are lower case on the wire.
pub(crate) type Headers = Vec<(String, String)>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    SynStream {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings,
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
    },
    Headers {
        stream_id: u32,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame type this side ignores (NOOP, CREDENTIAL, unknown).
    Ignored,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum FrameError {
    #[error("SPDY version {0} is not 3")]
    Version(u16),
    #[error("a frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("a {0} frame is too short")]
    Short(&'static str),
    #[error("header block: {0}")]
    Headers(String),
}

/// One connection's framing state: the two header compression streams.
pub(crate) struct Codec {
    inflate: Decompress,
    deflate: Compress,
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

impl Codec {
    pub(crate) fn new() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        // Only fails for a backend without dictionaries; zlib-rs has them.
        let _ = deflate.set_dictionary(&dictionary());
        Self {
            inflate: Decompress::new(true),
            deflate,
        }
    }

    /// Takes one whole frame off the front of `buf`; `None` until one has arrived.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let length = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
        if length > MAX_FRAME {
            return Err(FrameError::TooLarge(length));
        }
        if buf.len() < 8 + length {
            return Ok(None);
        }
        let control = buf[0] & 0x80 != 0;
        let head = buf.split_to(8);
        let mut body = buf.split_to(length).freeze();
        let flags = head[4];
        if !control {
            let stream_id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
            return Ok(Some(Frame::Data {
                stream_id,
                flags,
                data: body,
            }));
        }
        let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let frame = match kind {
            SYN_STREAM => {
                if body.len() < 10 {
                    return Err(FrameError::Short("SYN_STREAM"));
                }
                let stream_id = body.get_u32() & 0x7fff_ffff;
                let _associated = body.get_u32();
                let _priority_and_slot = body.get_u16();
                Frame::SynStream {
                    stream_id,
                    flags,
                    headers: self.inflate_headers(&body)?,
                }
            }
            SYN_REPLY => {
                if body.len() < 4 {
                    return Err(FrameError::Short("SYN_REPLY"));
                }
                let stream_id = body.get_u32() & 0x7fff_ffff;
                Frame::SynReply {
                    stream_id,
                    flags,
                    headers: self.inflate_headers(&body)?,
                }
            }
            RST_STREAM => {
                if body.len() < 8 {
                    return Err(FrameError::Short("RST_STREAM"));
                }
                Frame::RstStream {
                    stream_id: body.get_u32() & 0x7fff_ffff,
                    status: body.get_u32(),
                }
            }
            SETTINGS => Frame::Settings,
            PING => {
                if body.len() < 4 {
                    return Err(FrameError::Short("PING"));
                }
                Frame::Ping { id: body.get_u32() }
            }
            GOAWAY => {
                if body.len() < 4 {
                    return Err(FrameError::Short("GOAWAY"));
                }
                Frame::GoAway {
                    last_good: body.get_u32() & 0x7fff_ffff,
                }
            }
            HEADERS => {
                if body.len() < 4 {
                    return Err(FrameError::Short("HEADERS"));
                }
                let stream_id = body.get_u32() & 0x7fff_ffff;
                // Read to keep the compression stream in step; trailing headers mean nothing here.
                let _ = self.inflate_headers(&body)?;
                Frame::Headers { stream_id }
            }
            WINDOW_UPDATE => {
                if body.len() < 8 {
                    return Err(FrameError::Short("WINDOW_UPDATE"));
                }
                Frame::WindowUpdate {
                    stream_id: body.get_u32() & 0x7fff_ffff,
                    delta: body.get_u32() & 0x7fff_ffff,
                }
            }
            _ => Frame::Ignored,
        };
        Ok(Some(frame))
    }

    /// Appends `frame` to `out`.
    pub(crate) fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), FrameError> {
        match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                out.put_u32(stream_id & 0x7fff_ffff);
                out.put_u8(*flags);
                put_len(out, data.len())?;
                out.extend_from_slice(data);
            }
            Frame::SynStream {
                stream_id,
                flags,
                headers,
            } => {
                let block = self.deflate_headers(headers)?;
                control(out, SYN_STREAM, *flags, 10 + block.len())?;
                out.put_u32(*stream_id);
                out.put_u32(0);
                out.put_u16(0);
                out.extend_from_slice(&block);
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            } => {
                let block = self.deflate_headers(headers)?;
                control(out, SYN_REPLY, *flags, 4 + block.len())?;
                out.put_u32(*stream_id);
                out.extend_from_slice(&block);
            }
            Frame::RstStream { stream_id, status } => {
                control(out, RST_STREAM, 0, 8)?;
                out.put_u32(*stream_id);
                out.put_u32(*status);
            }
            Frame::Ping { id } => {
                control(out, PING, 0, 4)?;
                out.put_u32(*id);
            }
            Frame::GoAway { last_good } => {
                control(out, GOAWAY, 0, 8)?;
                out.put_u32(*last_good);
                out.put_u32(0);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                control(out, WINDOW_UPDATE, 0, 8)?;
                out.put_u32(*stream_id);
                out.put_u32(*delta);
            }
            Frame::Settings | Frame::Headers { .. } | Frame::Ignored => {}
        }
        Ok(())
    }

    fn inflate_headers(&mut self, block: &[u8]) -> Result<Headers, FrameError> {
        let mut plain = Vec::with_capacity(block.len() * 4);
        let mut input = block;
        loop {
            if plain.capacity() - plain.len() < 1024 {
                plain.reserve(4096);
            }
            let before_in = self.inflate.total_in();
            let result = self
                .inflate
                .decompress_vec(input, &mut plain, FlushDecompress::Sync);
            let consumed = usize::try_from(self.inflate.total_in() - before_in).unwrap_or(0);
            input = &input[consumed.min(input.len())..];
            match result {
                Ok(Status::Ok | Status::BufError) if input.is_empty() => {
                    // All input taken: done once zlib has room left over (nothing pending).
                    if plain.capacity() > plain.len() {
                        break;
                    }
                }
                Ok(Status::Ok | Status::BufError) => {}
                Ok(Status::StreamEnd) => break,
                Err(error) if error.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&dictionary())
                        .map_err(|e| FrameError::Headers(e.to_string()))?;
                }
                Err(error) => return Err(FrameError::Headers(error.to_string())),
            }
            if plain.len() > MAX_HEADERS {
                return Err(FrameError::Headers("over 256 KiB".to_owned()));
            }
        }
        parse_block(&plain)
    }

    fn deflate_headers(&mut self, headers: &Headers) -> Result<Vec<u8>, FrameError> {
        let mut plain = BytesMut::new();
        plain.put_u32(headers.len() as u32);
        for (name, value) in headers {
            plain.put_u32(name.len() as u32);
            plain.extend_from_slice(name.to_ascii_lowercase().as_bytes());
            plain.put_u32(value.len() as u32);
            plain.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = &plain[..];
        loop {
            out.reserve(256);
            let before_in = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| FrameError::Headers(e.to_string()))?;
            let consumed = usize::try_from(self.deflate.total_in() - before_in).unwrap_or(0);
            input = &input[consumed.min(input.len())..];
            // A sync flush is complete once input is gone and zlib left spare room.
            if input.is_empty() && out.capacity() > out.len() {
                return Ok(out);
            }
        }
    }
}

fn control(out: &mut BytesMut, kind: u16, flags: u8, length: usize) -> Result<(), FrameError> {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u8(flags);
    put_len(out, length)
}

fn put_len(out: &mut BytesMut, length: usize) -> Result<(), FrameError> {
    if length > MAX_FRAME {
        return Err(FrameError::TooLarge(length));
    }
    out.extend_from_slice(&(length as u32).to_be_bytes()[1..]);
    Ok(())
}

/// Name/value pairs; a value with NULs (several values) keeps them, callers split.
fn parse_block(mut plain: &[u8]) -> Result<Headers, FrameError> {
    let short = || FrameError::Headers("truncated".to_owned());
    let read_str = |plain: &mut &[u8]| -> Result<String, FrameError> {
        if plain.len() < 4 {
            return Err(short());
        }
        let len = plain.get_u32() as usize;
        if plain.len() < len {
            return Err(short());
        }
        let text = String::from_utf8_lossy(&plain[..len]).into_owned();
        plain.advance(len);
        Ok(text)
    };
    if plain.len() < 4 {
        return Err(short());
    }
    let count = plain.get_u32() as usize;
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name = read_str(&mut plain)?.to_ascii_lowercase();
        let value = read_str(&mut plain)?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// The value of header `name`, if present.
pub(crate) fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Frames written by one codec are read back by another (two ends of a connection), in
    /// order, with the header compression state carried across frames.
    #[test]
    fn frames_round_trip_across_codecs() {
        let mut writer = Codec::new();
        let mut reader = Codec::new();
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                flags: 0,
                headers: headers(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                stream_id: 3,
                flags: 0,
                headers: headers(&[("streamtype", "stdout"), ("port", "8080")]),
            },
            Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: Vec::new(),
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Ping { id: 7 },
            Frame::RstStream {
                stream_id: 5,
                status: RST_CANCEL,
            },
            Frame::WindowUpdate {
                stream_id: 3,
                delta: 65536,
            },
            Frame::GoAway { last_good: 3 },
        ];
        let mut wire = BytesMut::new();
        for frame in &frames {
            writer.encode(frame, &mut wire).unwrap();
        }
        let mut read = Vec::new();
        while let Some(frame) = reader.decode(&mut wire).unwrap() {
            read.push(frame);
        }
        assert_eq!(read, frames);
        assert!(wire.is_empty());
    }

    /// A frame split across reads is returned only once whole, whatever the split.
    #[test]
    fn frames_split_across_reads() {
        let mut writer = Codec::new();
        let mut wire = BytesMut::new();
        let frame = Frame::SynStream {
            stream_id: 1,
            flags: 0,
            headers: headers(&[("streamtype", "stdin")]),
        };
        writer.encode(&frame, &mut wire).unwrap();
        let data = Frame::Data {
            stream_id: 1,
            flags: 0,
            data: Bytes::from(vec![7u8; 3000]),
        };
        writer.encode(&data, &mut wire).unwrap();
        let whole = wire.freeze();
        for step in [1, 3, 7, 100, 1000] {
            let mut reader = Codec::new();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for chunk in whole.chunks(step) {
                buf.extend_from_slice(chunk);
                while let Some(frame) = reader.decode(&mut buf).unwrap() {
                    got.push(frame);
                }
            }
            assert_eq!(got, vec![frame.clone(), data.clone()], "step {step}");
        }
    }

    /// Header blocks are zlib with the SPDY dictionary: the stream announces its DICTID.
    #[test]
    fn header_blocks_use_the_spdy_dictionary() {
        let mut writer = Codec::new();
        let mut wire = BytesMut::new();
        writer
            .encode(
                &Frame::SynReply {
                    stream_id: 1,
                    flags: 0,
                    headers: headers(&[("status", "200")]),
                },
                &mut wire,
            )
            .unwrap();
        // 8 bytes of frame header, 4 of stream id, then the zlib header: CMF, FLG, DICTID.
        let zlib = &wire[12..];
        assert_eq!(zlib[1] & 0x20, 0x20, "FDICT set");
        assert_eq!(&zlib[2..6], &[0xe3, 0xc6, 0xa7, 0xc2]);
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let mut codec = Codec::new();
        let mut wrong_version = BytesMut::from(&[0x80, 2, 0, 1, 0, 0, 0, 0][..]);
        assert_eq!(
            codec.decode(&mut wrong_version),
            Err(FrameError::Version(2))
        );
        let mut huge = BytesMut::from(&[0x80, 3, 0, 1, 0, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            Codec::new().decode(&mut huge),
            Err(FrameError::TooLarge(_))
        ));
        let mut short_syn = BytesMut::from(&[0x80, 3, 0, 1, 0, 0, 0, 2, 0, 1][..]);
        assert_eq!(
            Codec::new().decode(&mut short_syn),
            Err(FrameError::Short("SYN_STREAM"))
        );
        let mut garbage_headers =
            BytesMut::from(&[0x80, 3, 0, 2, 0, 0, 0, 8, 0, 0, 0, 1, 1, 2, 3, 4][..]);
        assert!(matches!(
            Codec::new().decode(&mut garbage_headers),
            Err(FrameError::Headers(_))
        ));
    }
}
