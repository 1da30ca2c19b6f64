//! A headless Chromium driven over WebDriver (chromedriver), with nothing
//! but std and serde_json: one HTTP/1.1 request per connection, each answer
//! read to its Content-Length (chromedriver sends no chunked bodies).
//!
//! Chromium's console is read through chromedriver's log endpoint, with
//! the browser log enabled in the session's capabilities.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A browser session; the driver and the browser end when it drops.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

/// Where Debian puts the driver and the browser.
const DRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// Whether Debian's chromium and chromium-driver are installed, or which
/// is missing.
pub fn present() -> Result<(), String> {
    for path in [DRIVER, CHROMIUM] {
        if !Path::new(path).exists() {
            return Err(format!(
                "{path} is missing (Debian's chromium and chromium-driver; scripts/setup.sh installs them)"
            ));
        }
    }
    Ok(())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub fn start() -> Result<Browser, String> {
        present()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let driver = Command::new(DRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {DRIVER}: {e}"))?;
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
        };
        let until = Instant::now() + Duration::from_secs(30);
        while b
            .request("GET", "/status", None)
            .map(|v| v["value"]["ready"] == true)
            != Ok(true)
        {
            if Instant::now() > until {
                return Err("chromedriver did not get ready in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,900"]
            },
            "goog:loggingPrefs": {"browser": "ALL"}
        }}});
        let v = b.request("POST", "/session", Some(caps))?;
        b.session = v["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session: {v}"))?
            .to_string();
        Ok(b)
    }

    /// Opens `path`, a local file.
    pub fn open(&self, path: &Path) -> Result<(), String> {
        let url = format!("file://{}", path.display());
        self.session_request("POST", "url", json!({ "url": url }))
            .map(|_| ())
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub fn eval(&self, script: &str) -> Result<Value, String> {
        let v = self.session_request(
            "POST",
            "execute/sync",
            json!({"script": script, "args": []}),
        )?;
        Ok(v["value"].clone())
    }

    /// The browser console's entries since the last call: (level, message).
    pub fn console(&self) -> Result<Vec<(String, String)>, String> {
        let v = self.session_request("POST", "se/log", json!({"type": "browser"}))?;
        Ok(v["value"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or_default().to_string(),
                    e["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }

    fn session_request(&self, method: &str, what: &str, body: Value) -> Result<Value, String> {
        let path = format!("/session/{}/{what}", self.session);
        let v = self.request(method, &path, Some(body))?;
        match v["value"]["error"].as_str() {
            Some(e) => Err(format!("{what}: {e}: {}", v["value"]["message"])),
            None => Ok(v),
        }
    }

    fn request(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| e.to_string())?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        // chromedriver checks that Host names the port it listens on.
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        );
        s.write_all(head.as_bytes())
            .and_then(|_| s.write_all(body.as_bytes()))
            .map_err(|e| e.to_string())?;
        // It keeps the connection open: read the head, then exactly the
        // body its Content-Length gives.
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        let end = loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!(
                    "{method} {path}: the connection closed before the head"
                ));
            }
            got.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("{method} {path}: no Content-Length in {head:?}"))?;
        while got.len() < end + length {
            let n = s.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("{method} {path}: the connection closed mid-body"));
            }
            got.extend_from_slice(&buf[..n]);
        }
        let json = String::from_utf8_lossy(&got[end..end + length]);
        serde_json::from_str(&json).map_err(|e| format!("{method} {path}: {e}: {json}"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the browser, then the driver (which reaps the browser's
        // processes as it goes); killed if it has not gone in 10 s.
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = self.request("DELETE", &path, None);
        }
        let _ = self.request("GET", "/shutdown", None);
        let until = Instant::now() + Duration::from_secs(10);
        while matches!(self.driver.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
