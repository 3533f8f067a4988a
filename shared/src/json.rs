//! A minimal streaming JSON writer: the agent links this crate into other
//! people's processes, so it carries no serialisation dependency.

pub struct JsonWriter {
    out: String,
    /// Per nesting level: whether the next value needs a leading comma.
    need_comma: Vec<bool>,
    after_key: bool,
}

impl Default for JsonWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonWriter {
    pub fn new() -> Self {
        JsonWriter {
            out: String::new(),
            need_comma: vec![false],
            after_key: false,
        }
    }

    fn value_prefix(&mut self) {
        if self.after_key {
            self.after_key = false;
            return;
        }
        if let Some(c) = self.need_comma.last_mut() {
            if *c {
                self.out.push(',');
            }
            *c = true;
        }
    }

    pub fn begin_object(&mut self) {
        self.value_prefix();
        self.out.push('{');
        self.need_comma.push(false);
    }

    pub fn end_object(&mut self) {
        self.need_comma.pop();
        self.out.push('}');
    }

    pub fn begin_array(&mut self) {
        self.value_prefix();
        self.out.push('[');
        self.need_comma.push(false);
    }

    pub fn end_array(&mut self) {
        self.need_comma.pop();
        self.out.push(']');
    }

    pub fn key(&mut self, k: &str) {
        self.value_prefix();
        self.escaped(k);
        self.out.push(':');
        self.after_key = true;
    }

    pub fn string(&mut self, s: &str) {
        self.value_prefix();
        self.escaped(s);
    }

    pub fn uint(&mut self, v: u64) {
        self.value_prefix();
        self.out.push_str(&v.to_string());
    }

    pub fn int(&mut self, v: i64) {
        self.value_prefix();
        self.out.push_str(&v.to_string());
    }

    pub fn float(&mut self, v: f64) {
        self.value_prefix();
        if v.is_finite() {
            self.out.push_str(&format!("{v}"));
        } else {
            self.out.push_str("null");
        }
    }

    pub fn bool(&mut self, v: bool) {
        self.value_prefix();
        self.out.push_str(if v { "true" } else { "false" });
    }

    fn escaped(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }

    /// `"k": v` for an unsigned integer.
    pub fn uint_field(&mut self, k: &str, v: u64) {
        self.key(k);
        self.uint(v);
    }

    /// `"k": "v"`.
    pub fn string_field(&mut self, k: &str, v: &str) {
        self.key(k);
        self.string(v);
    }

    pub fn finish(mut self) -> String {
        self.out.push('\n');
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_values_and_escapes() {
        let mut w = JsonWriter::new();
        w.begin_object();
        w.key("a");
        w.begin_array();
        w.uint(1);
        w.int(-2);
        w.string("x\"\\\n\u{1}");
        w.end_array();
        w.key("b");
        w.bool(false);
        w.key("c");
        w.float(f64::NAN);
        w.end_object();
        assert_eq!(
            w.finish(),
            "{\"a\":[1,-2,\"x\\\"\\\\\\n\\u0001\"],\"b\":false,\"c\":null}\n"
        );
    }
}
