"""Optional protection of the UI and API: a bearer token, or HTTP basic auth with a scrypt hash.

The rules are pure functions and small classes with an injected clock (`parse_basic`, `session_cookie`,
`session_valid`, `FailureLimiter`, `SuccessCache`); `Authenticator` puts them together for `api.py`,
which applies them to its own routes only, so `/metrics` and the health endpoints stay as they are.

scrypt costs ~50 ms of CPU by design. It never runs on the event loop (the probes' stamps would wait
behind it): a thread of its own verifies hashes, with a bounded number of checks waiting, so a
flood of wrong passwords gets "busy" answers instead of queueing unbounded work. Recent successes are
remembered (keyed by an HMAC of the credential under a per-process key, never the password), and an
address that keeps failing is refused without hashing until its window ends.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import enum
import hashlib
import hmac
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1
COOKIE = "ttft_session"
DEFAULT_SESSION_S = 12 * 3600.0
# A cookie issued this far "in the future" is still accepted: clocks of replicas differ a little.
_CLOCK_SKEW_S = 60.0
_SESSION = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})", re.ASCII)


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """`scrypt$N$r$p$salt$hash` (base64), for `web.basic_password_hash`."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32)
    encode = base64.b64encode
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """Blocking, ~50 ms of CPU: call it off the event loop (`PasswordVerifier`)."""
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
        )
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(actual, expected)


def dummy_hash_like(encoded: str, random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """A hash with the parameters and lengths of `encoded` that no password matches: checking a password
    against it costs the same scrypt, so an unknown user is answered as slowly as a wrong password."""
    parts = encoded.split("$")
    if len(parts) != 6:
        return hash_password(base64.b64encode(random_bytes(16)).decode())
    scheme, n, r, p, salt, digest = parts
    try:
        salt_len, digest_len = len(base64.b64decode(salt)), len(base64.b64decode(digest))
    except (ValueError, binascii.Error):
        salt_len, digest_len = 16, 32
    encode = base64.b64encode
    return f"{scheme}${n}${r}${p}${encode(random_bytes(salt_len)).decode()}${encode(random_bytes(digest_len)).decode()}"


def parse_basic(authorization: str | None) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic ...` header, or None."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if colon else None


def parse_bearer(authorization: str | None) -> str | None:
    scheme, _, credentials = (authorization or "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def session_cookie(token: str, issued_at: int) -> str:
    """The login cookie: when it was issued and an HMAC of that under the token, so it carries neither
    the token nor anything usable past its lifetime."""
    mac = hmac.new(token.encode(), f"ttft-monitor web session {issued_at}".encode(), hashlib.sha256).hexdigest()
    return f"{issued_at}.{mac}"


def session_valid(token: str, value: str, *, now: float, lifetime_s: float) -> bool:
    match = _SESSION.fullmatch(value)
    if match is None:
        return False
    issued_at = int(match.group(1))
    if not now - lifetime_s <= issued_at <= now + _CLOCK_SKEW_S:
        return False
    return hmac.compare_digest(value.encode(), session_cookie(token, issued_at).encode())


def client_address(remote: str | None, forwarded_for: str | None, *, trust_proxy_headers: bool) -> str:
    """Whom failures are counted against: the peer, or, behind a reverse proxy we are told to trust
    (`web.trust_proxy_headers`), the last address in `X-Forwarded-For`, the one that proxy appended
    (earlier entries are whatever the client sent, and would let it pick its own address)."""
    if trust_proxy_headers and forwarded_for:
        last = forwarded_for.rsplit(",", 1)[-1].strip()
        if last:
            return last
    return remote or "unknown"


def forwarded_https(forwarded_proto: str | None) -> bool:
    """Whether `X-Forwarded-Proto` says the client spoke HTTPS to the (first) proxy."""
    return (forwarded_proto or "").split(",", 1)[0].strip().lower() == "https"


@dataclass(slots=True)
class _Failures:
    window_start: float
    count: int = 0
    throttle_logged: bool = False


class FailureLimiter:
    """At most `max_failures` failed checks per client address in a window of `window_s` seconds; then
    that address is refused, without checking anything, until its window ends. Remembers at most
    `max_addresses` addresses (the oldest are forgotten first)."""

    def __init__(self, *, max_failures: int = 10, window_s: float = 60.0, max_addresses: int = 10_000) -> None:
        self.max_failures, self.window_s, self.max_addresses = max_failures, window_s, max_addresses
        self._by_address: OrderedDict[str, _Failures] = OrderedDict()

    def _current(self, address: str, now: float) -> _Failures | None:
        entry = self._by_address.get(address)
        if entry is not None and now >= entry.window_start + self.window_s:
            del self._by_address[address]
            return None
        return entry

    def retry_after(self, address: str, now: float) -> float | None:
        """Seconds until `address` may try again, or None when it may now."""
        entry = self._current(address, now)
        if entry is None or entry.count < self.max_failures:
            return None
        return entry.window_start + self.window_s - now

    def record_failure(self, address: str, now: float) -> None:
        entry = self._current(address, now)
        if entry is None:
            entry = self._by_address[address] = _Failures(window_start=now)
            while len(self._by_address) > self.max_addresses:
                self._by_address.popitem(last=False)
        entry.count += 1

    def forgive(self, address: str, now: float) -> None:
        """Take back one failure recorded ahead of a check that then succeeded."""
        entry = self._current(address, now)
        if entry is not None and entry.count > 0:
            entry.count -= 1

    def first_refusal(self, address: str, now: float) -> bool:
        """True once per window: the refusal that is logged (the rest of the window's are not)."""
        entry = self._current(address, now)
        if entry is None or entry.throttle_logged:
            return False
        entry.throttle_logged = True
        return True

    def failures(self, address: str, now: float) -> int:
        entry = self._current(address, now)
        return entry.count if entry else 0


class SuccessCache:
    """Credentials that verified recently, for `ttl_s` seconds, at most `max_entries` of them. Keyed by
    an HMAC under a key that lives only in this process: a memory dump shows no password, and the key
    cannot be tested offline against guesses."""

    def __init__(self, *, ttl_s: float = 300.0, max_entries: int = 256, key: bytes | None = None) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._key = key if key is not None else os.urandom(32)
        self._expiry: OrderedDict[bytes, float] = OrderedDict()

    def _digest(self, user: str, password: str) -> bytes:
        return hmac.new(self._key, user.encode() + b"\0" + password.encode(), hashlib.sha256).digest()

    def hit(self, user: str, password: str, now: float) -> bool:
        digest = self._digest(user, password)
        expiry = self._expiry.get(digest)
        if expiry is None:
            return False
        if now >= expiry:
            del self._expiry[digest]
            return False
        return True

    def add(self, user: str, password: str, now: float) -> None:
        digest = self._digest(user, password)
        self._expiry.pop(digest, None)
        self._expiry[digest] = now + self.ttl_s
        while len(self._expiry) > self.max_entries:
            self._expiry.popitem(last=False)


class VerifierBusy(Exception):
    """Every password-check slot is taken; answer "try again" without hashing."""


class PasswordVerifier:
    """Runs `verify` (scrypt) on `workers` threads of its own, never on the event loop nor on the loop's
    default executor (which resolves the probes' DNS names). One thread by default: on a two-core host
    two hashing threads would take both cores from the probes. At most `workers + queue` checks are in
    flight; beyond that `check` raises VerifierBusy at once."""

    def __init__(
        self, *, workers: int = 1, queue: int = 4, verify: Callable[[str, str], bool] = verify_password
    ) -> None:
        self.workers, self.verify = workers, verify
        self._slots = threading.BoundedSemaphore(workers + queue)
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="ttft-auth")
            return self._executor

    async def check(self, password: str, encoded: str) -> bool:
        if not self._slots.acquire(blocking=False):
            raise VerifierBusy()
        try:
            future = self._pool().submit(self.verify, password, encoded)
        except BaseException:
            self._slots.release()
            raise
        # Released when the hash is done (or the check never started), not when the waiting request
        # goes away: a client that hangs up must not free a slot its scrypt still occupies.
        future.add_done_callback(lambda _done: self._slots.release())
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None


@dataclass(frozen=True, slots=True)
class Guard:
    """Who may see the UI: anyone (no token, no user), a bearer token holder, or a basic-auth user;
    and how long a sign-in lasts."""

    token: str | None = None
    basic_user: str | None = None
    basic_password_hash: str | None = None
    session_lifetime_s: float = DEFAULT_SESSION_S
    trust_proxy_headers: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.token) or self.basic_user is not None

    def token_matches(self, candidate: str) -> bool:
        return bool(self.token) and hmac.compare_digest(candidate.encode(), (self.token or "").encode())


class Outcome(enum.Enum):
    ALLOWED = "allowed"
    DENIED = "denied"  # 401
    THROTTLED = "throttled"  # 429, with retry_after_s
    BUSY = "busy"  # 503: every password-check slot is taken


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    retry_after_s: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.outcome is Outcome.ALLOWED


_ALLOWED, _DENIED = Verdict(Outcome.ALLOWED), Verdict(Outcome.DENIED)


@dataclass(slots=True)
class Authenticator:
    """The guard's rules with their state: the failure limiter, the cache of successes, the verifier
    threads. One per listener; the event loop's thread is the only one that touches the limiter and
    the cache (the verifier's threads only hash)."""

    guard: Guard
    limiter: FailureLimiter = field(default_factory=FailureLimiter)
    cache: SuccessCache = field(default_factory=SuccessCache)
    verifier: PasswordVerifier = field(default_factory=PasswordVerifier)
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    _dummy_hash: str = field(default="", init=False)
    _busy_logged_at: float = field(default=-1e18, init=False)

    def __post_init__(self) -> None:
        if self.guard.basic_password_hash:
            self._dummy_hash = dummy_hash_like(self.guard.basic_password_hash)

    def new_session(self) -> str:
        assert self.guard.token
        return session_cookie(self.guard.token, int(self.wall_clock()))

    def session_ok(self, cookie: str | None) -> bool:
        token = self.guard.token
        return bool(token and cookie) and session_valid(
            token or "", cookie or "", now=self.wall_clock(), lifetime_s=self.guard.session_lifetime_s
        )

    def throttled(self, address: str, *, method: str) -> Verdict | None:
        """A 429 verdict while `address` is over its failure limit (logged once per window), else None."""
        now = self.clock()
        wait = self.limiter.retry_after(address, now)
        if wait is None:
            return None
        if self.limiter.first_refusal(address, now):
            structlog.get_logger().warning(
                "auth_failed_throttled",
                address=address,
                method=method,
                failures=self.limiter.failures(address, now),
                window_s=self.limiter.window_s,
                retry_after_s=round(wait, 1),
            )
        return Verdict(Outcome.THROTTLED, retry_after_s=wait)

    def failed(self, address: str, *, method: str, recorded: bool = False) -> Verdict:
        now = self.clock()
        if not recorded:
            self.limiter.record_failure(address, now)
        structlog.get_logger().warning(
            "auth_failed", address=address, method=method, failures=self.limiter.failures(address, now)
        )
        return _DENIED

    def login(self, candidate: str, address: str) -> Verdict:
        """The sign-in form's token."""
        refusal = self.throttled(address, method="login")
        if refusal is not None:
            return refusal
        if self.guard.token_matches(candidate):
            return _ALLOWED
        return self.failed(address, method="login")

    async def check(self, *, authorization: str | None, cookie: str | None, address: str) -> Verdict:
        guard = self.guard
        if not guard.enabled:
            return _ALLOWED
        if self.session_ok(cookie):
            return _ALLOWED
        bearer = parse_bearer(authorization) if guard.token else None
        basic = parse_basic(authorization) if guard.basic_user is not None and guard.basic_password_hash else None
        if bearer is None and basic is None:
            return _DENIED  # nothing offered (a browser's first visit): not a failure
        if basic is not None and self.cache.hit(*basic, self.clock()):
            return _ALLOWED
        method = "bearer" if bearer is not None else "basic"
        refusal = self.throttled(address, method=method)
        if refusal is not None:
            return refusal
        if bearer is not None:
            return _ALLOWED if guard.token_matches(bearer) else self.failed(address, method=method)
        assert basic is not None and guard.basic_user is not None and guard.basic_password_hash
        user, password = basic
        known = hmac.compare_digest(user.encode(), guard.basic_user.encode())
        # The same scrypt for an unknown user as for a wrong password: timing says nothing about names.
        encoded = guard.basic_password_hash if known else self._dummy_hash
        # Counted as a failure before hashing and forgiven on success: 50 requests arriving together
        # must not all pass the limit while the first ones are still hashing.
        self.limiter.record_failure(address, self.clock())
        try:
            matches = await self.verifier.check(password, encoded)
        except VerifierBusy:
            now = self.clock()
            self.limiter.forgive(address, now)
            if now - self._busy_logged_at >= self.limiter.window_s:
                self._busy_logged_at = now
                structlog.get_logger().warning("auth_verifier_busy", slots=self.verifier.workers, address=address)
            return Verdict(Outcome.BUSY, retry_after_s=1.0)
        except BaseException:
            self.limiter.forgive(address, self.clock())
            raise
        if known and matches:
            self.limiter.forgive(address, self.clock())
            self.cache.add(user, password, self.clock())
            return _ALLOWED
        return self.failed(address, method=method, recorded=True)

    def close(self) -> None:
        self.verifier.close()
