"""Networking: the client (ours and libtpu's service), targets, the discovery reader."""
