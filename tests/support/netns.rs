//! Hosts with real network separation on one machine (issue 33): a network namespace per
//! host (`hs-<pid>-<host>`), each with a veth pair into a bridge of the root namespace and an
//! address of its own in one free 10.213.x.0/24 block; the root namespace holds the bridge's
//! address (.254), where a receiver or a load client can sit. Used by the multi-host test
//! (tests/it/multihost.rs) and the soak's `--hosts 2` mode (tests/soak/).
//!
//! Cleanup: `Drop` deletes the namespaces (a namespace's end of a veth pair goes with it,
//! and with it the pair) and the bridge. Needs root and `ip` (iproute2); `Net::setup` says
//! why it cannot run, for the caller's skip rule. Must not: start processes in the
//! namespaces (callers run `ip netns exec <ns> ...` themselves) or print anything but a
//! cleanup failure.

#![allow(dead_code)]

use std::process::{Command, Stdio};

/// `ip <args>`, or what it said.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The namespaces, the bridge and the veth pairs; every one of them removed on Drop.
pub struct Net {
    pub pid: u32,
    /// x of 10.213.x.0/24.
    pub x: u8,
    /// Every host with the last byte of its address.
    hosts: Vec<(&'static str, u8)>,
    namespaces: Vec<String>,
    links: Vec<String>,
}

impl Net {
    pub fn ns(&self, host: &str) -> String {
        format!("hs-{}-{host}", self.pid)
    }

    /// The root namespace's end of `host`'s veth pair (at most 15 bytes: h + pid + host).
    pub fn veth(&self, host: &str) -> String {
        format!("h{}{host}", self.pid)
    }

    pub fn bridge(&self) -> String {
        format!("h{}br", self.pid)
    }

    pub fn addr(&self, host: &str) -> String {
        let last = self
            .hosts
            .iter()
            .find(|(h, _)| *h == host)
            .unwrap_or_else(|| panic!("no host {host} in this net"))
            .1;
        format!("10.213.{}.{last}", self.x)
    }

    pub fn bridge_addr(&self) -> String {
        format!("10.213.{}.254", self.x)
    }

    pub fn cidr(&self) -> String {
        format!("10.213.{}.0/24", self.x)
    }

    /// Make one namespace per host of `hosts` (a name of at most 2 bytes, since it ends
    /// the veth's name, and the last byte of its address, 1 to 253).
    pub fn setup(hosts: &[(&'static str, u8)]) -> Result<Net, String> {
        let pid = std::process::id();
        let used = Command::new("ip")
            .args(["-4", "addr"])
            .output()
            .map_err(|e| format!("ip -4 addr: {e}"))?;
        let used = String::from_utf8_lossy(&used.stdout).into_owned();
        let x = (0..200u32)
            .map(|i| ((pid + i) % 200 + 20) as u8)
            .find(|x| !used.contains(&format!("10.213.{x}.")))
            .ok_or("no free 10.213.x.0/24 block")?;
        let mut net = Net {
            pid,
            x,
            hosts: hosts.to_vec(),
            namespaces: Vec::new(),
            links: Vec::new(),
        };
        let br = net.bridge();
        ip(&["link", "add", &br, "type", "bridge"])?;
        net.links.push(br.clone());
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.bridge_addr()),
            "dev",
            &br,
        ])?;
        ip(&["link", "set", &br, "up"])?;
        for &(host, _) in hosts {
            let ns = net.ns(host);
            ip(&["netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            let (outer, inner) = (net.veth(host), format!("{}n", net.veth(host)));
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            net.links.push(outer.clone());
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &br])?;
            ip(&["link", "set", &outer, "up"])?;
            let addr = format!("{}/24", net.addr(host));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The host's link up or down (its end in the root namespace).
    pub fn link(&self, host: &str, up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.veth(host), state])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("netns cleanup: {e}");
            }
        }
        // The veths went with their namespaces; what is left (a pair whose namespace was
        // never made) and the bridge go now.
        for link in self.links.drain(..).rev() {
            let exists = Command::new("ip")
                .args(["link", "show", &link])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if exists && let Err(e) = ip(&["link", "del", &link]) {
                eprintln!("netns cleanup: {e}");
            }
        }
    }
}
