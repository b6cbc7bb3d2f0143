"""What an episode runs in, as a service reaches it through camg-helper:
sandbox calls, containers, the lowers the helper accepts, the census of what
its sandboxes hold, and the shell action space those environments share."""
