//! A generated shell script as the steps `tune apply` takes: the `ip` commands that create
//! devices first, then every `tc` line as one `tc -batch` file. Pure.

#[derive(Clone, Debug, PartialEq)]
pub struct Steps {
    /// `ip` command lines (arguments after `ip`), run before the batch.
    pub ip: Vec<Vec<String>>,
    /// The `tc -batch` file: one tc command per line, without the leading `tc`.
    pub tc_batch: String,
    /// IFB devices the script creates (removed again on rollback).
    pub creates: Vec<String>,
}

/// Splits a script into its steps; any line that is neither a comment, `set -e`, an `ip` nor
/// a `tc` command is refused rather than skipped.
pub fn steps(script: &str) -> Result<Steps, String> {
    let mut s = Steps {
        ip: Vec::new(),
        tc_batch: String::new(),
        creates: Vec::new(),
    };
    for (n, raw) in script.lines().enumerate() {
        // Shell tolerance the generators add ("|| true", quiet redirections) is not a step.
        let line = raw
            .split("||")
            .next()
            .unwrap_or("")
            .replace("2>/dev/null", "");
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line == "set -e" {
            continue;
        }
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        match words[0].as_str() {
            "tc" => {
                s.tc_batch += &words[1..].join(" ");
                s.tc_batch.push('\n');
            }
            "ip" => {
                if let [_, link, add, name, dev, ..] = &words[..] {
                    if link == "link" && add == "add" && name == "name" {
                        s.creates.push(dev.clone());
                    }
                }
                s.ip.push(words[1..].to_vec());
            }
            _ => {
                return Err(format!(
                    "line {}: `{line}` is not a tc or ip command",
                    n + 1
                ))
            }
        }
    }
    if s.tc_batch.is_empty() {
        return Err("the configuration has no tc command".into());
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_script_becomes_ip_steps_and_a_tc_batch() {
        let sh = crate::config::tc_cake(&crate::config::Shaping {
            dev: "wan0".into(),
            down_kbit: Some(50_000),
            up_kbit: Some(10_000),
            link: crate::link::LinkType::Raw,
            ack_filter: false,
        });
        let st = steps(&sh).unwrap();
        assert_eq!(
            st.ip,
            vec![
                vec!["link", "add", "name", "ifb4wan0", "type", "ifb"],
                vec!["link", "set", "dev", "ifb4wan0", "up"]
            ]
        );
        assert_eq!(st.creates, vec!["ifb4wan0"]);
        assert!(
            st.tc_batch
                .starts_with("qdisc replace dev wan0 root cake bandwidth 10000kbit raw"),
            "{}",
            st.tc_batch
        );
        assert_eq!(st.tc_batch.lines().count(), 4);
        assert!(steps("rm -rf /\n")
            .unwrap_err()
            .contains("not a tc or ip command"));
    }
}
