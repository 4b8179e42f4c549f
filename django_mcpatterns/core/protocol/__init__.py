"""memcached's protocols, sans-IO: requests to bytes, bytes to replies, and every Store command.

``wire`` (requests and replies), ``reader`` (parsing), ``replies`` (what a reply
means for a command) and ``commands`` (each Store command written once, as a
plan both drivers of :mod:`..client` run).  Nothing here opens a socket.
"""
