"""Pure rendering: every manifest, values file, policy, dashboard and alert we write, from the config and the
facts a step read. No I/O, no adapter: each function is table-tested without a host.

May import: core, security.
"""
