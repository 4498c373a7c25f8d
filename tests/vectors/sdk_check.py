#!/usr/bin/env python3
"""Checks hookspool's CONSTRUCTED test vectors with the providers' own verification code.

A vector is CONSTRUCTED when the provider publishes no signed example and we computed the
signature ourselves (its folder's SOURCE.md says so). Our verifier agreeing with our own
signer proves little, so each such vector is also fed to the provider's official SDK (or the
library its docs tell you to use), installed from PyPI by .ci/run into a venv pinned by
tests/vectors/sdk-requirements.txt: the SDK must accept the vector, refuse a one-byte-tampered
copy, and, where the SDK has a timestamp window, refuse the vector with its clock set past it.
Clocks are set to the vector's own time, never widened (tests/vectors/README.md).

A provider with no official SDK or reference library is listed in NO_SDK with the reason; the
run names it, so every CONSTRUCTED folder is either checked here or listed, and a new one that
is neither fails the run.

Usage: sdk_check.py [VECTORS_DIR] [--npm DIR] [--node NODE]
                    [--pubsub-token FILE --pubsub-jwks FILE --pubsub-audience AUD]

Providers whose official SDK is JavaScript only (NPM_CHECKED) are checked by sdk_check.mjs
beside this file, run with node from --npm DIR, the directory .ci/run installs
tests/vectors/sdk-npm/package-lock.json into (`npm ci`); its lines are passed through here.

Google Pub/Sub push tokens are not committed (Google publishes no signing key; the tests make
a key pair at run time): the Rust test (tests/it/vectors_sdk.rs) signs one with the key pair
tests/it/intake_oidc.rs uses and passes it here with its JWK Set.

Output, one line per folder, then a summary; exit status 1 when any check fails:
  CHECKED <folder> <package>==<version>: <what passed>   (<package>@<version> from npm)
  NO-SDK <folder>: <reason>
  FAIL <folder>: <what failed>
  NOT-RUN <folder>: <why> (run by hand without --npm or --pubsub-token)
Prints no secret (vectors hold made-up or published test secrets, but the lines do not need
them).
"""

import argparse
import contextlib
import datetime as _dt
import importlib.metadata
import io
import json
import sys
import tomllib
import types
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Folders whose CONSTRUCTED vectors no official SDK or reference library can check, and why.
# Each reason says what was looked at; "nothing computed" means the sender signs nothing (a
# shared token or Basic credentials compared as sent), so there is no signature to confirm.
NO_SDK = {
    "bitbucket": "Atlassian publishes no SDK or library that verifies a Bitbucket Cloud webhook signature; its docs describe the HMAC in prose only",
    "calendly": "Calendly publishes no SDK (an HTTP API and docs only)",
    "dropbox": "dropbox 12.2.5 (Dropbox's Python SDK) has no webhook-signature check; Dropbox's guide shows the HMAC inline",
    "gitlab": "nothing computed: X-Gitlab-Token is the secret token compared as sent; GitLab publishes no Python SDK (python-gitlab is a community project)",
    "intercom": "python-intercom 5.0.1 (Intercom's generated SDK) has no webhook-signature check",
    "jira": "Atlassian publishes no SDK or library that verifies a Jira Cloud webhook signature",
    "meta": "Meta publishes no SDK with an X-Hub-Signature-256 check (facebook-business 26.0.3 computes only appsecret_proof); its docs describe the check in prose",
    "netlify": "Netlify publishes no SDK that verifies its JWS, and its docs name no JWT library to use; a third-party JWT library would not be Netlify's own check",
    "okta": "nothing computed: Okta event hooks are not signed (a shared Authorization header value compared as sent)",
    "postmark": "nothing computed: Postmark signs nothing (HTTP Basic credentials given in the webhook URL)",
    "sentry": "sentry-sdk 2.76.0 is the error-reporting client, with no webhook-signature check; Sentry publishes no other Python library",
    "standard-webhooks-v1a": "standardwebhooks 1.3.0, the reference library, implements v1 only (no v1a, Ed25519); no reference library implements v1a",
    "telegram": "nothing computed: the Bot API signs nothing (the secret_token compared as sent); Telegram publishes no Python SDK",
    "twitch": "Twitch publishes no SDK with an EventSub signature check (twitchAPI on PyPI is a community project)",
    "typeform": "Typeform publishes no Python SDK with a webhook-signature check",
    "vercel": "vercel 0.12.1 (PyPI) has no webhook-signature check",
    "zendesk": "Zendesk publishes no Python SDK (zenpy is a community project)",
    "zoom": "Zoom publishes no Python SDK with a webhook check; url_validation.http carries no signature (the test asserts it is refused) and ZOOM-CRC-ELASTIC is a known answer from elastic/beats",
}


class Report:
    def __init__(self):
        self.failed = False

    def fail(self, folder, what):
        self.failed = True
        print(f"FAIL {folder}: {what}")


def version(dist):
    return f"{dist}=={importlib.metadata.version(dist)}"


def constructed_folders(vectors):
    """Folders whose SOURCE.md says CONSTRUCTED (any case): the rule the Rust test applies too."""
    return sorted(
        p.parent.name
        for p in vectors.glob("*/SOURCE.md")
        if "constructed" in p.read_text(encoding="utf-8").lower()
    )


def tampered(data, at=None):
    """`data` (bytes or str) with one byte changed: the lowest bit of the middle byte flipped."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    i = len(raw) // 2 if at is None else at
    out = raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :]
    return out.decode() if isinstance(data, str) else out


def tampered_b64url(segment):
    """A base64url segment with its middle character replaced (all six bits of a middle
    character are data, so the decoded bytes change)."""
    i = len(segment) // 2
    return segment[:i] + ("A" if segment[i] != "A" else "B") + segment[i + 1 :]


def frozen_datetime(unix_s):
    """A datetime class whose now() is `unix_s`, for SDKs that read datetime.now()."""

    class Frozen(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return _dt.datetime.fromtimestamp(unix_s, tz)

    return Frozen


def frozen_time(unix_s):
    """A stand-in for the `time` module whose time() is `unix_s`."""
    return types.SimpleNamespace(time=lambda: unix_s)


def parse_capture(path):
    """A capture (.http) as hookspool's sources::flow::parse_capture reads it: leading '#'
    lines are notes (`# at: <unix s>` the clock), then request line, headers, a blank line and
    the body byte for byte, cut to Content-Length."""
    text = path.read_bytes().decode("utf-8")
    at = None
    lines = text.split("\n")
    while lines and lines[0].startswith("#"):
        note = lines.pop(0).rstrip("\r")
        if note.startswith("# at:"):
            at = float(note.split(":", 1)[1])
    text = "\n".join(lines)
    if "\r\n\r\n" in text:
        head, body = text.split("\r\n\r\n", 1)
    else:
        head, _, body = text.partition("\n\n")
    head_lines = head.splitlines()
    method, target = head_lines[0].split()[:2]
    headers = {}
    for line in head_lines[1:]:
        k, v = line.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    raw = body.encode("utf-8")
    if "content-length" in headers:
        raw = raw[: int(headers["content-length"])]
    return types.SimpleNamespace(method=method, target=target, headers=headers, body=raw, at=at)


def accepts(call, quiet=False):
    """True when the SDK call returns truthy without raising; `quiet` swallows what the SDK
    prints."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
            return bool(call())
    except Exception:  # noqa: BLE001 - an SDK's refusal is reported by the caller
        return False


def refuses(call, errors=(), quiet=False):
    """True when the SDK refuses: returns False, or raises one of its documented `errors`.
    Any other exception is a misuse here, not a refusal, and counts as not refused."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
            return not call()
    except errors:
        return True
    except Exception:  # noqa: BLE001
        return False


class Checks:
    """One method per SDK-checked folder; each records what passed or fails the run."""

    def __init__(self, vectors, report, pubsub):
        self.vectors = vectors
        self.report = report
        self.pubsub = pubsub

    def run(self, folder, package, steps):
        """`steps`: (what, ok) pairs; all must hold."""
        bad = [what for what, ok in steps if not ok]
        if bad:
            for what in bad:
                self.report.fail(folder, f"{package}: {what}")
        else:
            print(f"CHECKED {folder} {package}: " + "; ".join(what for what, _ in steps))

    def load(self, folder, name="vectors.json"):
        return json.loads((self.vectors / folder / name).read_text(encoding="utf-8"))

    def stripe(self):
        import stripe
        from stripe import _webhook

        v = self.load("stripe")
        ts, body = v["timestamp"], v["body"]
        one = f"t={ts},v1={v['v1']}"
        both = f"t={ts},v1={v['v1_previous']},v1={v['v1']}"
        err = (stripe.SignatureVerificationError,)

        def verify(payload, header, secret, now):
            with mock.patch.object(_webhook, "time", frozen_time(now)):
                return stripe.WebhookSignature.verify_header(payload, header, secret, 300)

        self.run(
            "stripe",
            version("stripe"),
            [
                ("v1 accepted", accepts(lambda: verify(body, one, v["secret"], ts))),
                (
                    "a rolled header (two v1) accepted under each secret",
                    accepts(lambda: verify(body, both, v["secret"], ts))
                    and accepts(lambda: verify(body, both, v["previous_secret"], ts)),
                ),
                (
                    "tampered body refused",
                    refuses(lambda: verify(tampered(body), one, v["secret"], ts), err),
                ),
                (
                    "refused 301 s late (tolerance 300 s)",
                    refuses(lambda: verify(body, one, v["secret"], ts + 301), err),
                ),
            ],
        )

    def slack(self):
        from slack_sdk.signature import SignatureVerifier

        class Clock:
            def __init__(self, now):
                self._now = now

            def now(self):
                return self._now

        v = self.load("slack")["vectors"][0]
        cap = parse_capture(self.vectors / "slack" / "slash-command.http")
        ts = v["timestamp"]

        def valid(body, timestamp, sig, now):
            return SignatureVerifier(v["signing_secret"], clock=Clock(now)).is_valid(
                body, timestamp, sig
            )

        ch = cap.headers
        self.run(
            "slack",
            version("slack_sdk"),
            [
                (
                    f"{v['id']} accepted",
                    accepts(lambda: valid(v["body"], str(ts), v["expected_signature"], ts)),
                ),
                (
                    "slash-command.http accepted",
                    accepts(
                        lambda: valid(
                            cap.body,
                            ch["x-slack-request-timestamp"],
                            ch["x-slack-signature"],
                            ts,
                        )
                    ),
                ),
                (
                    "tampered body refused",
                    refuses(lambda: valid(tampered(v["body"]), str(ts), v["expected_signature"], ts)),
                ),
                (
                    "refused 301 s late (window 300 s)",
                    refuses(lambda: valid(v["body"], str(ts), v["expected_signature"], ts + 301)),
                ),
            ],
        )

    def discord(self):
        from discord_interactions import verify_key

        steps = []
        for v in self.load("discord")["vectors"]:
            body, ts = v["body"].encode(), str(v["timestamp"])
            steps.append(
                (
                    f"{v['id']} accepted",
                    accepts(lambda: verify_key(body, v["signature"], ts, v["public_key"]), True),
                )
            )
            steps.append(
                (
                    f"{v['id']} tampered body refused",
                    refuses(
                        lambda: verify_key(tampered(body), v["signature"], ts, v["public_key"]),
                        quiet=True,
                    ),
                )
            )
        self.run("discord", version("discord-interactions"), steps)

    def standard_webhooks(self):
        from standardwebhooks import webhooks
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError

        v = self.load("standard-webhooks")["vectors"][0]
        cap = parse_capture(self.vectors / "standard-webhooks" / "SW-A.http")
        ts = v["timestamp"]
        headers = {
            "webhook-id": v["msg_id"],
            "webhook-timestamp": str(ts),
            "webhook-signature": v["expected_signature"],
        }
        err = (WebhookVerificationError,)

        def verify(body, hdrs, now):
            with mock.patch.object(webhooks, "datetime", frozen_datetime(now)):
                Webhook(v["secret"]).verify(body, hdrs, json_parse=False)
            return True

        self.run(
            "standard-webhooks",
            version("standardwebhooks"),
            [
                (f"{v['id']} accepted", accepts(lambda: verify(v["payload"].encode(), headers, ts))),
                ("SW-A.http accepted", accepts(lambda: verify(cap.body, cap.headers, ts))),
                (
                    "tampered body refused",
                    refuses(lambda: verify(tampered(v["payload"].encode()), headers, ts), err),
                ),
                (
                    "refused 301 s late and 301 s early (window 300 s)",
                    refuses(lambda: verify(v["payload"].encode(), headers, ts + 301), err)
                    and refuses(lambda: verify(v["payload"].encode(), headers, ts - 301), err),
                ),
            ],
        )

    def hubspot(self):
        from hubspot.exceptions import InvalidSignatureTimestampError
        from hubspot.utils import signature as hs

        err = (InvalidSignatureTimestampError,)

        def valid(sig, secret, body, uri, method, ts_ms, now_s):
            with mock.patch.object(hs, "datetime", frozen_datetime(now_s)):
                return hs.Signature.is_valid(sig, secret, body, uri, method, "v3", str(ts_ms))

        v = self.load("hubspot")["vectors"][0]
        args = (v["client_secret"], v["body"], v["uri"], v["method"], v["timestamp_ms"])
        now = v["timestamp_ms"] // 1000
        # The CONSTRUCTED capture, signed for the bobbin kit's secret and callback URL.
        bobbin = REPO / "bobbins" / "hubspot" / "webhooks" / "captures"
        kit = tomllib.loads((bobbin / "kit.toml").read_text(encoding="utf-8"))
        cap = parse_capture(bobbin / "contact-creation.http")
        cap_args = (
            kit["secrets"]["secret"],
            cap.body.decode(),
            kit["bobbin"]["settings"]["callback_url"],
            cap.method,
            cap.headers["x-hubspot-request-timestamp"],
        )
        cap_sig = cap.headers["x-hubspot-signature-v3"]
        self.run(
            "hubspot",
            version("hubspot-api-client"),
            [
                (f"{v['id']} accepted", accepts(lambda: valid(v["signature"], *args, now))),
                (
                    "the capture contact-creation.http accepted",
                    accepts(lambda: valid(cap_sig, *cap_args, cap.at)),
                ),
                (
                    "tampered bodies refused",
                    refuses(
                        lambda: valid(v["signature"], args[0], tampered(args[1]), *args[2:], now)
                    )
                    and refuses(
                        lambda: valid(
                            cap_sig, cap_args[0], tampered(cap_args[1]), *cap_args[2:], cap.at
                        )
                    ),
                ),
                (
                    "refused 300 s late (window under 300 s)",
                    refuses(lambda: valid(v["signature"], *args, now + 300), err),
                ),
            ],
        )

    def mailgun(self):
        from mailgun import security

        kit = tomllib.loads(
            (REPO / "bobbins/mailgun/webhooks/captures/kit.toml").read_text(encoding="utf-8")
        )
        key = kit["secrets"]["secret"]
        s = self.load("mailgun", "delivered.json")["signature"]
        ts = int(s["timestamp"])

        def verify(token, now):
            with mock.patch.object(security, "time", frozen_time(now)):
                return security.SecurityGuard.verify_webhook(key, token, s["timestamp"], s["signature"])

        self.run(
            "mailgun",
            version("mailgun"),
            [
                ("delivered.json's signature accepted", accepts(lambda: verify(s["token"], ts))),
                # Mailgun signs timestamp + token, not the body: the token is what to tamper.
                ("tampered token refused", refuses(lambda: verify(tampered(s["token"]), ts))),
                ("refused 901 s late (max age 900 s)", refuses(lambda: verify(s["token"], ts + 901))),
            ],
        )

    def google_pubsub(self):
        if not self.pubsub:
            # Run by hand without a token: say so. The Rust test always passes one and
            # requires this folder CHECKED.
            print("NOT-RUN google-pubsub: no --pubsub-token given (tests/it/vectors_sdk.rs passes one)")
            return
        from google.auth import exceptions as gexc
        from google.auth.transport import Response
        from google.oauth2 import id_token
        import jwt

        token_file, jwks_file, audience = self.pubsub
        token = Path(token_file).read_text(encoding="utf-8").strip()
        jwks = Path(jwks_file).read_bytes()

        class Published(Response):
            """Google's key endpoint, answered from the JWK Set on disk: no network."""

            status = 200
            headers = {"content-type": "application/json; charset=UTF-8"}
            data = jwks

        def request(url, method="GET", **_kwargs):
            assert url.startswith("https://www.googleapis.com/oauth2/"), url
            return Published()

        def verify(t):
            # What Google's "Authenticate push subscriptions" sample calls for a push token.
            claims = id_token.verify_oauth2_token(t, request, audience=audience)
            return claims["email_verified"] is True

        head, payload, sig = token.split(".")
        err = (ValueError, gexc.GoogleAuthError, jwt.PyJWTError)
        self.run(
            "google-pubsub",
            version("google-auth"),
            [
                ("the run-time push token accepted", accepts(lambda: verify(token))),
                (
                    "a tampered signature refused",
                    refuses(lambda: verify(f"{head}.{payload}.{tampered_b64url(sig)}"), err),
                ),
                (
                    "a tampered claim refused",
                    refuses(lambda: verify(f"{head}.{tampered_b64url(payload)}.{sig}"), err),
                ),
                (
                    "another audience refused",
                    refuses(
                        lambda: id_token.verify_oauth2_token(token, request, audience=audience + "x"),
                        err,
                    ),
                ),
            ],
        )


# Folders checked by sdk_check.mjs with the provider's npm SDK, and that SDK.
NPM_CHECKED = {
    "github": "@octokit/webhooks-methods",
    "linear": "@linear/sdk",
    "shopify": "@shopify/shopify-api",
}


def run_npm_checks(npm_dir, node, vectors, report):
    """Runs sdk_check.mjs from `npm_dir` (where its packages resolve) and passes its lines
    through; a folder of NPM_CHECKED without a CHECKED line fails."""
    import subprocess

    script = (HERE / "sdk_check.mjs").read_text(encoding="utf-8")
    try:
        out = subprocess.run(
            [node, "--input-type=module", "-e", script, str(vectors.resolve()), str(REPO)],
            cwd=npm_dir,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        for folder in NPM_CHECKED:
            report.fail(folder, f"sdk_check.mjs did not run: {e}")
        return
    checked = set()
    for line in out.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        folder = rest.split(" ", 1)[0].rstrip(":")
        if folder not in NPM_CHECKED:
            continue
        if kind == "CHECKED":
            checked.add(folder)
            print(line)
        elif kind == "FAIL":
            report.fail(folder, rest.split(": ", 1)[1] if ": " in rest else rest)
    for folder in sorted(set(NPM_CHECKED) - checked):
        if not any(line.startswith(f"FAIL {folder}:") for line in out.stdout.splitlines()):
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            report.fail(folder, f"sdk_check.mjs gave no verdict (exit {out.returncode}: {tail})")


CHECKED = {
    "discord": Checks.discord,
    "google-pubsub": Checks.google_pubsub,
    "hubspot": Checks.hubspot,
    "mailgun": Checks.mailgun,
    "slack": Checks.slack,
    "standard-webhooks": Checks.standard_webhooks,
    "stripe": Checks.stripe,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vectors", nargs="?", default=str(HERE))
    ap.add_argument("--npm", help="the directory holding node_modules for sdk_check.mjs")
    ap.add_argument("--node", default="node")
    ap.add_argument("--pubsub-token")
    ap.add_argument("--pubsub-jwks")
    ap.add_argument("--pubsub-audience")
    a = ap.parse_args()
    vectors = Path(a.vectors)
    pubsub = None
    if a.pubsub_token:
        pubsub = (a.pubsub_token, a.pubsub_jwks, a.pubsub_audience)
    report = Report()
    checks = Checks(vectors, report, pubsub)
    folders = constructed_folders(vectors)
    npm_folders = [f for f in folders if f in NPM_CHECKED]
    if npm_folders and a.npm:
        run_npm_checks(a.npm, a.node, vectors, report)
    for folder in folders:
        if folder in NPM_CHECKED:
            if not a.npm:
                # Run by hand without the npm packages: say so. The Rust test passes --npm
                # and requires these folders CHECKED.
                print(f"NOT-RUN {folder}: no --npm given ({NPM_CHECKED[folder]} checks it)")
        elif folder in CHECKED:
            try:
                CHECKED[folder](checks)
            except Exception as e:  # noqa: BLE001 - a broken check fails the run, named
                report.fail(folder, f"the check raised {type(e).__name__}: {e}")
        elif folder in NO_SDK:
            print(f"NO-SDK {folder}: {NO_SDK[folder]}")
        else:
            report.fail(
                folder,
                "CONSTRUCTED, but neither checked with an SDK here nor listed in NO_SDK with a reason",
            )
    for folder in sorted(set(CHECKED) | set(NO_SDK) | set(NPM_CHECKED)):
        if folder not in folders:
            report.fail(folder, "listed in sdk_check.py but its SOURCE.md no longer says CONSTRUCTED")
    print(f"{len(folders)} CONSTRUCTED folders; {'FAILED' if report.failed else 'all accounted for'}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
