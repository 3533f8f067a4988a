//! The protobuf wire format, as much of it as profile.proto needs: varint
//! fields (uint64, int64, bool), length-delimited fields (strings,
//! messages) and packed repeated varints. A code generator and its runtime
//! would be more than these few lines.

/// One message being encoded.
#[derive(Default)]
pub struct Message(Vec<u8>);

const VARINT: u64 = 0;
const LEN: u64 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Message {
    pub fn new() -> Message {
        Message::default()
    }

    fn key(&mut self, field: u32, wire: u64) {
        varint(&mut self.0, ((field as u64) << 3) | wire);
    }

    /// A uint64 or bool field. Zero is every field's default, which
    /// proto3 leaves out.
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Message {
        if v != 0 {
            self.key(field, VARINT);
            varint(&mut self.0, v);
        }
        self
    }

    /// An int64 field: negative values take ten bytes, two's complement.
    pub fn int(&mut self, field: u32, v: i64) -> &mut Message {
        self.uint(field, v as u64)
    }

    /// A string or bytes field, written even when empty: an element of a
    /// repeated field keeps its place (string_table[0] is "").
    pub fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Message {
        self.key(field, LEN);
        varint(&mut self.0, b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    pub fn message(&mut self, field: u32, m: &Message) -> &mut Message {
        self.bytes(field, &m.0)
    }

    /// A packed repeated uint64 or int64 field (zeros kept: each value has
    /// its place); nothing when there are no values.
    pub fn packed(&mut self, field: u32, values: impl IntoIterator<Item = u64>) -> &mut Message {
        let mut body = Vec::new();
        for v in values {
            varint(&mut body, v);
        }
        if !body.is_empty() {
            self.bytes(field, &body);
        }
        self
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// A decoder for the tests: the fields of a message, in order.
#[cfg(test)]
pub mod decode {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value<'a> {
        Varint(u64),
        Bytes(&'a [u8]),
    }

    fn varint(b: &[u8], at: &mut usize) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = b[*at];
            *at += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return v;
            }
        }
        panic!("varint longer than 10 bytes");
    }

    pub fn fields(b: &[u8]) -> Vec<(u32, Value<'_>)> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < b.len() {
            let key = varint(b, &mut at);
            let field = (key >> 3) as u32;
            match key & 7 {
                0 => out.push((field, Value::Varint(varint(b, &mut at)))),
                2 => {
                    let n = varint(b, &mut at) as usize;
                    out.push((field, Value::Bytes(&b[at..at + n])));
                    at += n;
                }
                w => panic!("wire type {w} is not written"),
            }
        }
        out
    }

    /// The varints of a packed field.
    pub fn packed(b: &[u8]) -> Vec<u64> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < b.len() {
            out.push(varint(b, &mut at));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::decode::{fields, packed, Value};
    use super::*;

    #[test]
    fn fields_encode_as_the_wire_format_says() {
        let mut inner = Message::new();
        inner.uint(1, 150);
        let mut m = Message::new();
        m.uint(1, 0)
            .uint(2, 1)
            .int(3, -1)
            .bytes(6, b"")
            .bytes(6, b"hi")
            .message(4, &inner)
            .packed(5, [0, 1, 300])
            .packed(7, []);
        let b = m.into_bytes();
        // The protobuf documentation's example: field 1 = 150 is 08 96 01.
        assert_eq!(inner.into_bytes(), [0x08, 0x96, 0x01]);
        assert_eq!(&b[..2], [0x10, 0x01]);
        let f = fields(&b);
        assert_eq!(f.len(), 6, "{f:?}");
        assert_eq!(f[1], (3, Value::Varint(u64::MAX)));
        assert_eq!(f[2], (6, Value::Bytes(b"")));
        assert_eq!(f[3], (6, Value::Bytes(b"hi")));
        assert_eq!(f[4], (4, Value::Bytes(&[0x08, 0x96, 0x01])));
        let Value::Bytes(p) = f[5].1 else { panic!() };
        assert_eq!(packed(p), [0, 1, 300]);
    }
}
