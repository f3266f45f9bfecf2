"""Options: every option object, its fields and checks, and where a value comes from.

- :mod:`~longctx.options.groups`: the option objects (:class:`CorpusOptions`,
  :class:`Limits`, :class:`RequestOptions`, :class:`ServerOptions`), every
  default, and the resolution of the server's URL, model, key and headers;
- :mod:`~longctx.options.fields`: the field machinery (:func:`option`,
  :class:`OptionFields`): each option's default, check, flag and storing;
- :mod:`~longctx.options.checks`: the rules the fields name (URLs, blanks,
  stored values);
- :mod:`~longctx.options.settings`: where a value comes from when no
  argument gives it (``LONGCTX_*`` variables, ``.longctx.toml``, the user file);
- :mod:`~longctx.options.store_location`: which store a ``store`` setting names (the embedded
  SQLite file, or a ``postgresql://`` URL, checked), and such a URL with its password redacted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# The package's names (its ``__all__``), each with the module it comes from, imported on first use
# (PEP 562) like the names of longctx itself.
_EXPORTS: dict[str, str] = {
    "AFFINITY_BODY_FIELD": "longctx.options.groups",
    "DEFAULT_AFFINITY_HEADERS": "longctx.options.groups",
    "DEFAULT_BASE_URL": "longctx.options.groups",
    "DEFAULT_CONCURRENCY": "longctx.options.groups",
    "DEFAULT_MAX_STALE_SHARE": "longctx.options.groups",
    "DEFAULT_MAX_TOKENS": "longctx.options.groups",
    "DEFAULT_PAGE_IMAGE_SIDE": "longctx.options.groups",
    "DEFAULT_REPLICA_RETRY_SECONDS": "longctx.options.groups",
    "DEFAULT_RESERVED_QUESTION_TOKENS": "longctx.options.groups",
    "DEFAULT_STALL_TIMEOUT_SECONDS": "longctx.options.groups",
    "DEFAULT_TIMEOUT_SECONDS": "longctx.options.groups",
    "DISPATCHES": "longctx.options.groups",
    "ECHOED_HEADERS": "longctx.options.groups",
    "ORDERINGS": "longctx.options.groups",
    "PDF_PAGE_MODES": "longctx.options.groups",
    "CorpusOptions": "longctx.options.groups",
    "Limits": "longctx.options.groups",
    "RequestOptions": "longctx.options.groups",
    "ResolvedServer": "longctx.options.groups",
    "ServerOptions": "longctx.options.groups",
    "configured_base_url": "longctx.options.groups",
    "default_home": "longctx.options.groups",
    "instant_retries_requested": "longctx.options.groups",
    "resolve_affinity_headers": "longctx.options.groups",
    "resolve_api_key": "longctx.options.groups",
    "resolve_base_urls": "longctx.options.groups",
    "resolve_model": "longctx.options.groups",
    "ALWAYS": "longctx.options.fields",
    "DEFAULT": "longctx.options.fields",
    "VALUE_TYPES": "longctx.options.fields",
    "OptionFields": "longctx.options.fields",
    "OptionSpec": "longctx.options.fields",
    "option": "longctx.options.fields",
    "option_spec": "longctx.options.fields",
    "cache_salt": "longctx.options.checks",
    "not_blank": "longctx.options.checks",
    "server_urls": "longctx.options.checks",
    "spellings": "longctx.options.checks",
    "stored_dict": "longctx.options.checks",
    "stored_optional_int": "longctx.options.checks",
    "stored_optional_tuple": "longctx.options.checks",
    "stored_tuple": "longctx.options.checks",
    "url_list": "longctx.options.checks",
    "PROJECT_CONFIG_NAME": "longctx.options.settings",
    "Setting": "longctx.options.settings",
    "environment_variable": "longctx.options.settings",
    "project_config_file": "longctx.options.settings",
    "settable": "longctx.options.settings",
    "settable_keys": "longctx.options.settings",
    "setting": "longctx.options.settings",
    "user_config_file": "longctx.options.settings",
}

if TYPE_CHECKING:
    from longctx.options.checks import cache_salt as cache_salt
    from longctx.options.checks import not_blank as not_blank
    from longctx.options.checks import server_urls as server_urls
    from longctx.options.checks import spellings as spellings
    from longctx.options.checks import stored_dict as stored_dict
    from longctx.options.checks import stored_optional_int as stored_optional_int
    from longctx.options.checks import stored_optional_tuple as stored_optional_tuple
    from longctx.options.checks import stored_tuple as stored_tuple
    from longctx.options.checks import url_list as url_list
    from longctx.options.fields import ALWAYS as ALWAYS
    from longctx.options.fields import DEFAULT as DEFAULT
    from longctx.options.fields import VALUE_TYPES as VALUE_TYPES
    from longctx.options.fields import OptionFields as OptionFields
    from longctx.options.fields import OptionSpec as OptionSpec
    from longctx.options.fields import option as option
    from longctx.options.fields import option_spec as option_spec
    from longctx.options.groups import AFFINITY_BODY_FIELD as AFFINITY_BODY_FIELD
    from longctx.options.groups import DEFAULT_AFFINITY_HEADERS as DEFAULT_AFFINITY_HEADERS
    from longctx.options.groups import DEFAULT_BASE_URL as DEFAULT_BASE_URL
    from longctx.options.groups import DEFAULT_CONCURRENCY as DEFAULT_CONCURRENCY
    from longctx.options.groups import DEFAULT_MAX_STALE_SHARE as DEFAULT_MAX_STALE_SHARE
    from longctx.options.groups import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS
    from longctx.options.groups import DEFAULT_PAGE_IMAGE_SIDE as DEFAULT_PAGE_IMAGE_SIDE
    from longctx.options.groups import DEFAULT_REPLICA_RETRY_SECONDS as DEFAULT_REPLICA_RETRY_SECONDS
    from longctx.options.groups import DEFAULT_RESERVED_QUESTION_TOKENS as DEFAULT_RESERVED_QUESTION_TOKENS
    from longctx.options.groups import DEFAULT_STALL_TIMEOUT_SECONDS as DEFAULT_STALL_TIMEOUT_SECONDS
    from longctx.options.groups import DEFAULT_TIMEOUT_SECONDS as DEFAULT_TIMEOUT_SECONDS
    from longctx.options.groups import DISPATCHES as DISPATCHES
    from longctx.options.groups import ECHOED_HEADERS as ECHOED_HEADERS
    from longctx.options.groups import ORDERINGS as ORDERINGS
    from longctx.options.groups import PDF_PAGE_MODES as PDF_PAGE_MODES
    from longctx.options.groups import CorpusOptions as CorpusOptions
    from longctx.options.groups import Limits as Limits
    from longctx.options.groups import RequestOptions as RequestOptions
    from longctx.options.groups import ResolvedServer as ResolvedServer
    from longctx.options.groups import ServerOptions as ServerOptions
    from longctx.options.groups import configured_base_url as configured_base_url
    from longctx.options.groups import default_home as default_home
    from longctx.options.groups import instant_retries_requested as instant_retries_requested
    from longctx.options.groups import resolve_affinity_headers as resolve_affinity_headers
    from longctx.options.groups import resolve_api_key as resolve_api_key
    from longctx.options.groups import resolve_base_urls as resolve_base_urls
    from longctx.options.groups import resolve_model as resolve_model
    from longctx.options.settings import PROJECT_CONFIG_NAME as PROJECT_CONFIG_NAME
    from longctx.options.settings import Setting as Setting
    from longctx.options.settings import environment_variable as environment_variable
    from longctx.options.settings import project_config_file as project_config_file
    from longctx.options.settings import settable as settable
    from longctx.options.settings import settable_keys as settable_keys
    from longctx.options.settings import setting as setting
    from longctx.options.settings import user_config_file as user_config_file


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
