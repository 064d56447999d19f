"""A planted key and every form a leak of it could take (raw, URL-encoded, base64, Basic auth), and a whole
database as text, to search for them."""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, quote_plus

import sqlalchemy as sa

USER = "probe-user"
KEY = "Kx9!q2Zr7$Lm4w8PvT3n"


def forms_of(secret: str) -> set[str]:
    """Every form a leak could take; none may appear anywhere."""
    raw = [secret.encode(), f"{USER}:{secret}".encode(), f"apikey:{secret}".encode()]
    found = {
        secret,
        quote(secret, safe=""),
        re.sub(r"%[0-9A-F]{2}", lambda escape: escape.group(0).lower(), quote(secret, safe="")),
        quote_plus(secret),
    }
    for value in raw:
        for encoded in (base64.b64encode(value).decode(), base64.urlsafe_b64encode(value).decode()):
            found |= {encoded, encoded.rstrip("=")}
    return found


def leaks(text: str) -> list[str]:
    return sorted(form for form in forms_of(KEY) if form in text)


async def database_text(url: str) -> str:
    """Every row of every table, as text."""
    from monitor.store.engine import create_engine

    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            metadata = sa.MetaData()
            await connection.run_sync(metadata.reflect)
            chunks = []
            for table in metadata.sorted_tables:
                rows = (await connection.execute(sa.select(table))).all()
                chunks += [repr(tuple(row)) for row in rows]
    finally:
        await engine.dispose()
    return "\n".join(chunks)
