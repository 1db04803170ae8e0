//! The preset zlib dictionary of SPDY/3 header blocks (draft-mbelshe-httpbis-spdy-00, 2.6.10.1):
//! length-prefixed header names and common values, then a run of status lines, dates and media
//! types. Built from those words so it can be read; `dictionary_is_the_specs` pins its length
//! and Adler-32 (the DICTID every SPDY/3 header stream announces: `e3c6a7c2`).

const WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

const TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// The dictionary's bytes.
pub(super) fn dictionary() -> Vec<u8> {
    let mut out = Vec::with_capacity(1423);
    for word in WORDS {
        out.extend_from_slice(&(word.len() as u32).to_be_bytes());
        out.extend_from_slice(word.as_bytes());
    }
    out.extend_from_slice(TAIL.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// zlib's Adler-32, as the stream header's DICTID carries it.
    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for byte in data {
            a = (a + u32::from(*byte)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn dictionary_is_the_specs() {
        let dictionary = dictionary();
        assert_eq!(dictionary.len(), 1423);
        assert_eq!(adler32(&dictionary), 0xe3c6_a7c2);
        assert!(dictionary.starts_with(b"\0\0\0\x07options"));
        assert!(dictionary.ends_with(b",*,enq=0."));
    }
}
