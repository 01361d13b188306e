"""foundation"""
