"""Reading a config file: YAML, `${VAR}` expansion, validation, references and secrets.

Every problem found is collected into one ConfigError, each with its key path, so a user fixes the
whole file in one go rather than one error per restart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import ValidationError

from monitor.config.cost import budget_problems
from monitor.config.errors import ConfigError, ConfigIssue
from monitor.config.expand import expand_env
from monitor.config.fields import ENV_NAME_PATTERN
from monitor.config.messages import translate
from monitor.config.models import REFERENCE_ERROR_TYPE, Config, format_path
from monitor.config.references import reference_problems
from monitor.config.secrets import ResolvedSecret, SecretError, resolve_secret, webhook_secret_key
from monitor.redact import CREDENTIAL_HEADERS

Loc = tuple[str | int, ...]

# A config is a few kilobytes and a few hundred values; these bounds are far above any real one.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 64


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Config:
    """The validated config in `path`, with `${VAR}` expanded from `environ` and secrets resolved.

    Raises ConfigError listing every problem found; never a raw YAML or pydantic traceback.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    file = str(path)
    raw = read_yaml_mapping(Path(path), file)
    expansion = expand_env(raw, env)
    data = expansion.value

    derived: list[tuple[Loc, str]] = []
    config: Config | None = None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            if error["type"] == REFERENCE_ERROR_TYPE:
                continue  # reported below per key path
            # Values taken from the environment may be secrets: describe them, never quote them.
            derived.append(translate(error, Config, hide_input=tuple(error["loc"]) in expansion.substituted))
    derived += reference_problems(data)
    provider_secrets, receiver_secrets, secret_problems = resolve_all_secrets(data, env)
    derived += secret_problems
    derived += webhook_secret_problems(data, receiver_secrets)
    proxy_passwords, proxy_problems = resolve_proxy_passwords(data, env)
    derived += proxy_problems

    # A value left unexpanded (its variable is unset) is reported once, not again as a bad value.
    unexpanded = [loc for loc, _ in expansion.problems]
    problems = literal_credential_problems(raw) + expansion.problems
    problems += [(loc, msg) for loc, msg in derived if not any(loc[: len(bad)] == bad for bad in unexpanded)]

    if not problems and config is not None:
        # Only a config valid in every other way is projected: the projection reads its jobs and prices.
        problems = budget_problems(config)
    if problems or config is None:
        order = document_order(data)
        problems = sorted(dict.fromkeys(problems), key=lambda problem: _position(problem[0], order))
        # `from None`: a chained ValidationError would print input values, which may be secrets.
        raise ConfigError(ConfigIssue(file, format_path(loc), message) for loc, message in problems) from None

    return config.model_copy(
        update={
            "providers": {
                name: _with_proxy_password(
                    provider.with_secret(
                        provider_secrets[name].value,
                        source=provider_secrets[name].source,
                        from_environment=inserted_under(
                            expansion.inserted, ("providers", name, "base_url"), ("providers", name, "headers")
                        ),
                    ),
                    provider.proxy,
                    proxy_passwords.get(("providers", name)),
                )
                for name, provider in config.providers.items()
            },
            "alerts": config.alerts.model_copy(
                update={
                    "receivers": {
                        name: _with_proxy_password(
                            receiver.with_secrets(
                                secret=receiver_secrets[name][0].value, url=receiver_secrets[name][1].value
                            ),
                            receiver.proxy,
                            proxy_passwords.get(("alerts", "receivers", name)),
                        )
                        for name, receiver in config.alerts.receivers.items()
                    }
                }
            ),
        }
    )


class _ProxySection(Protocol):
    def with_password(self, password: str | None) -> Any: ...


def _with_proxy_password(owner: Any, proxy: _ProxySection, password: str | None) -> Any:
    """`owner` (a provider or a receiver, as `with_secret` returned it) with its proxy's password."""
    if password is None:
        return owner
    return owner.model_copy(update={"proxy": proxy.with_password(password)})


def resolve_proxy_passwords(
    data: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[Loc, str], list[tuple[Loc, str]]]:
    """Each `proxy:` section's password (`password_env`, `NAME_FILE`, `password_file`), by its owner's key path."""
    owners: list[tuple[Loc, Any]] = []
    if isinstance(data.get("providers"), Mapping):
        owners += [(("providers", name), item) for name, item in data["providers"].items()]
    alerts = data.get("alerts")
    if isinstance(alerts, Mapping) and isinstance(alerts.get("receivers"), Mapping):
        owners += [(("alerts", "receivers", name), item) for name, item in alerts["receivers"].items()]
    found: dict[Loc, str] = {}
    problems: list[tuple[Loc, str]] = []
    for loc, owner in owners:
        proxy = owner.get("proxy") if isinstance(owner, Mapping) else None
        if not isinstance(proxy, Mapping):
            continue
        env_name, file = proxy.get("password_env"), proxy.get("password_file")
        if (env_name is not None and file is not None) or not isinstance(env_name, str | None):
            continue  # validation reports it
        if env_name is not None and not ENV_NAME_PATTERN.match(env_name):
            continue
        if file is not None and not isinstance(file, str):
            continue
        try:
            secret = resolve_secret(
                env_name=env_name,
                file=Path(file).expanduser() if file else None,
                environ=environ,
                env_field="password_env",
                file_field="password_file",
            )
        except SecretError as exc:
            problems.append(((*loc, "proxy", exc.field), str(exc)))
            continue
        if secret.value is not None:
            found[loc] = secret.value
    return found, problems


def inserted_under(inserted: Mapping[Loc, list[str]], *prefixes: Loc) -> tuple[str, ...]:
    """Environment values `${VAR}` put anywhere under one of `prefixes` (a provider's URL and headers)."""
    found = [
        value
        for loc, values in inserted.items()
        if any(loc[: len(prefix)] == prefix for prefix in prefixes)
        for value in values
    ]
    return tuple(dict.fromkeys(found))


def read_yaml_mapping(path: Path, file: str) -> dict[str, Any]:
    """The top-level mapping in `path`, or ConfigError for a missing, unreadable or malformed file."""

    def fail(message: str, line: int | None = None, column: int | None = None) -> ConfigError:
        return ConfigError([ConfigIssue(file, "", message, line, column)])

    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise fail(
                f"is larger than {MAX_CONFIG_BYTES // 1024 // 1024} MiB, which no config needs; "
                "check that --config names the right file"
            )
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise fail(f"file not found (looked at {path.absolute()}); pass --config PATH or create it") from None
    except IsADirectoryError:
        raise fail("is a directory; pass the path of the YAML file itself") from None
    except PermissionError:
        raise fail("cannot be read: permission denied; check the file's owner and mode") from None
    except UnicodeDecodeError as exc:
        raise fail(f"is not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise fail(f"cannot be read: {exc.strerror}") from None

    try:
        data = load_yaml_bounded(text)
    except YamlTooLarge as exc:
        raise fail(str(exc)) from None
    except RecursionError:
        raise fail("values are nested too deeply to read (thousands of levels); a config needs a few") from None
    except yaml.MarkedYAMLError as exc:
        message, mark = yaml_error_message(exc)
        raise fail(message, mark.line + 1 if mark else None, mark.column + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise fail(f"YAML syntax error: {exc}") from None

    if data is None:
        raise fail("the file is empty; see config.yaml in the repository for a documented example")
    if not isinstance(data, dict):
        raise fail(
            f"the file must be a YAML mapping of top-level keys (location, database, providers, targets, "
            f"prompts, jobs, ...), but it holds a {type(data).__name__}"
        )
    return data


def yaml_error_message(exc: yaml.MarkedYAMLError) -> tuple[str, yaml.Mark | None]:
    """A plainer message for a YAML error, and the position it should point at."""
    problem = exc.problem or "malformed YAML"
    context = exc.context or ""
    if context == "duplicate key":
        return problem, exc.problem_mark
    if "alias" in context or "undefined alias" in problem:
        # Unquoted cron expressions are the usual cause, and PyYAML's wording does not suggest it.
        message = "YAML syntax error: a value starting with '*' must be quoted, e.g. schedule: \"*/5 * * * *\""
        return message, exc.context_mark or exc.problem_mark
    hint = ""
    if "'\\t'" in problem:
        hint = "; indent with spaces, not tabs"
    elif "mapping values are not allowed" in problem:
        hint = "; a value containing ': ' must be quoted"
    return f"YAML syntax error: {problem}{f' ({context})' if context else ''}{hint}", exc.problem_mark


class YamlTooLarge(ValueError):
    """The document would expand to more values than any config has (an alias bomb, say)."""


def load_yaml_bounded(text: str, *, max_values: int = MAX_YAML_VALUES) -> Any:
    """`text` parsed as YAML, refusing documents whose aliases expand past `max_values` values.

    The node graph is composed first, where an alias is one shared node; its expanded size is
    counted once per distinct node before anything is built, so "billion laughs" is refused after
    reading a few hundred bytes instead of being walked a billion times by everything downstream.
    """
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values = expanded_size(node, limit=max_values)
        if values > max_values:
            raise YamlTooLarge(
                f"YAML anchors and aliases (&name / *name) expand to more than {max_values} values, "
                "which no config needs (an alias bomb?); write the values out or use fewer aliases"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def expanded_size(root: yaml.Node, *, limit: int) -> int:
    """How many scalars, sequences and mappings `root` stands for once every alias is expanded.

    Counted once per distinct node (memoised by identity) and stopped just past `limit`. An alias
    to one of its own ancestors (`&a [*a]`) would be infinite: YamlTooLarge.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(child)] for child in children))
            continue
        if key in on_path:
            raise YamlTooLarge("a YAML alias refers to a value that contains it (an endless loop); remove it")
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise YamlTooLarge("a YAML alias refers to a value that contains it (an endless loop); remove it")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types: its classes are Any
    """SafeLoader that rejects a key given twice in one mapping instead of keeping the last silently,
    and values nested deeper than any config (`[[[[...` would otherwise recurse until Python gives up)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlTooLarge(
                    f"values are nested more than {MAX_YAML_DEPTH} levels deep, which no config needs; "
                    "check the brackets and indentation"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    "duplicate key",
                    node.start_mark,
                    f"key '{key}' appears twice in one mapping (first on line {first}); keep one",
                    key_node.start_mark,
                )
            if isinstance(key, str | int | float | bool):
                seen[key] = key_node
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def literal_credential_problems(raw: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """Credential headers written out in the file instead of taken from `${VAR}`."""
    owners: list[tuple[Loc, Any]] = []
    for section in ("providers",):
        if isinstance(raw.get(section), Mapping):
            owners += [((section, name), item) for name, item in raw[section].items()]
    alerts = raw.get("alerts")
    if isinstance(alerts, Mapping) and isinstance(alerts.get("receivers"), Mapping):
        owners += [(("alerts", "receivers", name), item) for name, item in alerts["receivers"].items()]
    problems: list[tuple[Loc, str]] = []
    for loc, owner in owners:
        headers = owner.get("headers") if isinstance(owner, Mapping) else None
        if not isinstance(headers, Mapping):
            continue
        for name, value in headers.items():
            if str(name).lower() in CREDENTIAL_HEADERS and isinstance(value, str) and "${" not in value:
                problems.append(
                    (
                        (*loc, "headers", name),
                        "literal credentials are not allowed in the config file; "
                        f'write {name}: "...${{VAR}}" and export VAR',
                    )
                )
    return problems


def resolve_all_secrets(
    data: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, ResolvedSecret], dict[str, tuple[ResolvedSecret, ResolvedSecret]], list[tuple[Loc, str]]]:
    """Secrets of every provider and receiver, by name, plus a problem per one that cannot be read.

    Works on the parsed data so a missing key is reported alongside schema errors. Entries whose key
    settings are themselves invalid are skipped: validation reports those (without echoing values).
    """
    none = ResolvedSecret(None, "none")
    problems: list[tuple[Loc, str]] = []

    def resolve(loc: Loc, item: Any, env_key: str, file_key: str | None) -> ResolvedSecret:
        if not isinstance(item, Mapping):
            return none
        env_name, file = item.get(env_key), item.get(file_key) if file_key else None
        if env_name is not None and file is not None:
            return none
        if env_name is not None and not (isinstance(env_name, str) and ENV_NAME_PATTERN.match(env_name)):
            return none
        if file is not None and not isinstance(file, str):
            return none
        try:
            return resolve_secret(
                env_name=env_name,
                file=Path(file).expanduser() if file else None,
                environ=environ,
                env_field=env_key,
                file_field=file_key or env_key,
            )
        except SecretError as exc:
            problems.append(((*loc, exc.field), str(exc)))
            return none

    providers: dict[str, ResolvedSecret] = {}
    if isinstance(data.get("providers"), Mapping):
        for name, item in data["providers"].items():
            providers[str(name)] = resolve(("providers", name), item, "api_key_env", "api_key_file")

    receivers: dict[str, tuple[ResolvedSecret, ResolvedSecret]] = {}
    alerts = data.get("alerts")
    if isinstance(alerts, Mapping) and isinstance(alerts.get("receivers"), Mapping):
        for name, item in alerts["receivers"].items():
            loc = ("alerts", "receivers", name)
            receivers[str(name)] = (
                resolve(loc, item, "secret_env", "secret_file"),
                resolve(loc, item, "url_env", None),
            )
    return providers, receivers, problems


def webhook_secret_problems(
    data: Mapping[str, Any], receiver_secrets: Mapping[str, tuple[ResolvedSecret, ResolvedSecret]]
) -> list[tuple[Loc, str]]:
    """A problem per webhook receiver whose signing secret is not `whsec_<base64>`.

    Checked at load so `check-config` and a reload refuse it, rather than every notification failing.
    """
    alerts = data.get("alerts")
    receivers = alerts.get("receivers") if isinstance(alerts, Mapping) else None
    if not isinstance(receivers, Mapping):
        return []
    problems: list[tuple[Loc, str]] = []
    for name, item in receivers.items():
        secret = receiver_secrets.get(str(name), (ResolvedSecret(None, "none"),))[0].value
        if not isinstance(item, Mapping) or item.get("type") != "webhook" or secret is None:
            continue
        try:
            webhook_secret_key(secret)
        except ValueError as exc:
            key = "secret_env" if item.get("secret_env") is not None else "secret_file"
            problems.append((("alerts", "receivers", name, key), str(exc)))
    return problems


def document_order(data: Any, loc: Loc = ()) -> dict[Loc, int]:
    """Each key path in `data` numbered in the order it appears, for sorting problems like the file."""
    order: dict[Loc, int] = {}

    def walk(node: Any, here: Loc) -> None:
        order[here] = len(order)
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, (*here, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, (*here, index))

    walk(data, loc)
    return order


def _position(loc: Loc, order: dict[Loc, int]) -> tuple[int, int]:
    for length in range(len(loc), -1, -1):
        if loc[:length] in order:
            return order[loc[:length]], len(loc) - length
    return len(order), 0
