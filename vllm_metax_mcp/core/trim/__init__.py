"""trim"""
