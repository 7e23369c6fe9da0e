"""Plugins that ship with the core, registered the same way as outside ones."""

from specdec.builtin import default_verify, plain, user_provided

BUILTIN_PLUGINS = [plain, user_provided, default_verify]
