"""Every pattern through a real twemproxy (nutcracker), in text mode."""
