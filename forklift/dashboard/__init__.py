"""`forklift dashboard`: the whole system in a browser, read through forklift.admin.

The `dashboard` extra (forklift.errors.install_hint says how to install it): Flask
renders the pages with Jinja2 and waitress serves them. This package's own modules
import Flask only from `web`, `actions` and `server`; `config` does not, so the CLI can
check its flags and say how to install the extra before anything needs it.
"""
