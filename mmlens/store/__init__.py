"""The store: the only owner of SQL; writes records and returns typed records."""
