"""The main window and what builds it: the window shell, its docks and menus, chat tabs and tiles, model
loading, session state across restarts, window fitting, desktop integration and the Qt event loop."""
