"""Framework-free core: routing, the memcached cluster client, the embedded store
and the patterns.  Imports only the standard library and pymemcache."""
