// The npm half of tests/vectors/sdk_check.py (read that file first): the CONSTRUCTED vectors
// of providers whose official SDK is JavaScript only, each fed to that SDK's own
// verification function, which must accept it, refuse a one-byte-tampered copy and, where it
// keeps a time window, refuse it with its clock set past the window.
//
// sdk_check.py runs it as `node --input-type=module -e <this file> <vectors dir> <repo>`
// from the directory holding node_modules (installed by .ci/run with `npm ci` from
// tests/vectors/sdk-npm/package-lock.json), so the packages resolve from there. It prints
// `CHECKED <folder> <package>@<version>: ...` or `FAIL <folder>: ...` lines, one folder each.

import { readFileSync } from "node:fs";
import { join } from "node:path";

const [vectors, repo] = process.argv.slice(-2);

function version(pkg) {
  const meta = JSON.parse(readFileSync(join("node_modules", pkg, "package.json"), "utf8"));
  return `${pkg}@${meta.version}`;
}

function load(folder, name = "vectors.json") {
  return JSON.parse(readFileSync(join(vectors, folder, name), "utf8"));
}

// `data` with the lowest bit of its middle byte flipped.
function tampered(data) {
  const b = Buffer.from(data);
  b[Math.floor(b.length / 2)] ^= 0x01;
  return typeof data === "string" ? b.toString("utf8") : b;
}

// A capture (.http) read as sources::flow::parse_capture reads it (see sdk_check.py).
function capture(path) {
  let text = readFileSync(path, "utf8");
  const lines = text.split("\n");
  while (lines.length && lines[0].startsWith("#")) lines.shift();
  text = lines.join("\n");
  const cut = text.includes("\r\n\r\n") ? "\r\n\r\n" : "\n\n";
  const at = text.indexOf(cut);
  const head = at < 0 ? text : text.slice(0, at);
  let body = Buffer.from(at < 0 ? "" : text.slice(at + cut.length), "utf8");
  const [start, ...rest] = head.split(/\r?\n/);
  const [method, target] = start.split(/\s+/);
  const headers = {};
  for (const line of rest) {
    const i = line.indexOf(":");
    headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  if (headers["content-length"] !== undefined) {
    body = body.subarray(0, Number(headers["content-length"]));
  }
  return { method, target, headers, body };
}

// True when `call` resolves truthy without throwing.
async function accepts(call) {
  try {
    return Boolean(await call());
  } catch {
    return false;
  }
}

// True when `call` resolves falsy or throws an error whose message matches `errors` (a
// misuse that throws something else is not a refusal).
async function refuses(call, errors = /^$/) {
  try {
    return !(await call());
  } catch (e) {
    return errors.test(String(e && e.message));
  }
}

async function report(folder, pkg, steps) {
  const bad = steps.filter(([, ok]) => !ok);
  if (bad.length) {
    for (const [what] of bad) console.log(`FAIL ${folder}: ${version(pkg)}: ${what}`);
  } else {
    console.log(`CHECKED ${folder} ${version(pkg)}: ${steps.map(([w]) => w).join("; ")}`);
  }
}

// Runs `call` with Date.now() fixed at `ms`.
async function at(ms, call) {
  const real = Date.now;
  Date.now = () => ms;
  try {
    return await call();
  } finally {
    Date.now = real;
  }
}

const checks = {
  // GitHub's vector is its published GH-DOCS; docs-hello-world.http is the CONSTRUCTED
  // request around it.
  async github() {
    const { verify } = await import("@octokit/webhooks-methods");
    const v = load("github").vectors.find((x) => x.id === "GH-DOCS");
    const cap = capture(join(vectors, "github", "docs-hello-world.http"));
    await report("github", "@octokit/webhooks-methods", [
      ["GH-DOCS accepted", await accepts(() => verify(v.secret, v.body, v.expected))],
      [
        "docs-hello-world.http accepted",
        await accepts(() =>
          verify(v.secret, cap.body.toString("utf8"), cap.headers["x-hub-signature-256"]),
        ),
      ],
      ["tampered body refused", await refuses(() => verify(v.secret, tampered(v.body), v.expected))],
    ]);
  },

  // Linear's SDK also checks the body's webhookTimestamp (ms) within 60 s of now.
  async linear() {
    const { LinearWebhookClient } = await import("@linear/sdk/webhooks");
    const v = load("linear").vectors[0];
    const ts = JSON.parse(v.body).webhookTimestamp;
    const client = new LinearWebhookClient(v.secret);
    const verify = (body, now) => at(now, () => client.verify(Buffer.from(body), v.signature));
    await report("linear", "@linear/sdk", [
      [`${v.id} accepted`, await accepts(() => verify(v.body, ts))],
      [
        "tampered body refused",
        await refuses(() => verify(tampered(v.body), ts), /Invalid webhook signature/),
      ],
      [
        "accepted 60 s late and 60 s early (the window's edges)",
        (await accepts(() => verify(v.body, ts + 60000))) &&
          (await accepts(() => verify(v.body, ts - 60000))),
      ],
      [
        "refused 61 s late (window 60 s)",
        await refuses(() => verify(v.body, ts + 61000), /Invalid webhook timestamp/),
      ],
      [
        "refused 61 s early",
        await refuses(() => verify(v.body, ts - 61000), /Invalid webhook timestamp/),
      ],
    ]);
  },

  // The vector with the delivery headers of the bobbin's CONSTRUCTED capture (the SDK
  // requires topic, shop domain, API version and webhook id beside the HMAC).
  async shopify() {
    await import("@shopify/shopify-api/adapters/node");
    const { shopifyApi, LogSeverity } = await import("@shopify/shopify-api");
    const v = load("shopify");
    const cap = capture(join(repo, "bobbins/shopify/webhooks/captures/orders-create.http"));
    const shopify = shopifyApi({
      apiKey: "hookspool-kit",
      apiSecretKey: v.secret,
      apiVersion: cap.headers["x-shopify-api-version"],
      hostName: "hooks.example.org",
      isEmbeddedApp: false,
      logger: { level: LogSeverity.Error, log: () => {} },
    });
    const validate = async (body, headers) => {
      const r = await shopify.webhooks.validate({
        rawBody: body,
        rawRequest: { method: cap.method, url: cap.target, headers },
        rawResponse: {},
      });
      return r.valid;
    };
    const headers = { ...cap.headers, "x-shopify-hmac-sha256": v.hmac_b64 };
    await report("shopify", "@shopify/shopify-api", [
      ["vectors.json's HMAC accepted", await accepts(() => validate(v.body, headers))],
      ["orders-create.http accepted", await accepts(() => validate(cap.body.toString("utf8"), cap.headers))],
      ["tampered body refused", await refuses(() => validate(tampered(v.body), headers))],
    ]);
  },
};

for (const folder of Object.keys(checks)) {
  try {
    await checks[folder]();
  } catch (e) {
    console.log(`FAIL ${folder}: the check threw ${e && e.name}: ${e && e.message}`);
  }
}
